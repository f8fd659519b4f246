//! The end of a session's authority on this gateway, whatever ends it: a
//! close from the control plane, a lease nobody renewed, a newer open that
//! displaces it, or the process shutting down.
//!
//! Every end goes the same way ([`Authority::end`]): the authority is
//! already out of the session table (so no new connection finds it); its
//! open connections are cut `session_ended` and its held requests answered
//! `approval_withdrawn`; once every one of its connections has its record
//! on disk, a drop report naming the CA by digest and each secret by name
//! is signed and put on the record *after* those records, as an entry of
//! the batch chain. So the report reaches the control plane even when the
//! close's answer does not (a lost reply, a lapse while the control plane
//! is away), and when the control plane holds the batch with a member's
//! report for an attempt, it holds every record of that attempt on that
//! member. The CA, its leaves and the values go with the session's last
//! reference, when its last connection lets go.
//!
//! A close that comes again for an authority already ended (a retry whose
//! first answer was lost) gets the same signed report, from
//! [`Authority::report_of`]; an open for an attempt already ended here is
//! refused ([`Authority::was_ended`]), so a late or repeated open can never
//! bring an ended authority back.
//!
//! # Limits
//!
//! - The reports of the last [`RECENT`] ends are kept for repeated closes
//!   (about 1 KiB each); older ones are in the batch chain.
//! - An end waits at most [`CONNECTIONS_BOUND`] for the session's
//!   connections to be recorded; they are cut at once, so this bounds only
//!   a writer that is stuck (logged).

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use talos_certs::{DropReason, DropReport, GatewayKey, Signed};
use tokio::sync::{watch, Notify};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::records::journal::RecordSink;
use crate::session::lease::{Lease, SharedClock};
use crate::session::sessions::{Session, Sessions};
use talos_contract::sync::Locked;

/// Ends whose reports are kept for a repeated close: a control plane
/// retries within minutes; past this many ends the report is still in the
/// batch chain.
pub const RECENT: usize = 16 * 1024;

/// The longest an end waits for its connections' records.
pub const CONNECTIONS_BOUND: Duration = Duration::from_secs(30);

/// The longest the lease watcher sleeps between looks.
const WATCH_AT_MOST: Duration = Duration::from_secs(1);

/// The chain entry of a signed report: `{"report": <envelope>}`.
pub fn report_entry(signed: &Signed) -> Vec<u8> {
    serde_json::to_vec(&serde_json::json!({ "report": signed }))
        .expect("an envelope always serialises")
}

/// What ends authorities on this gateway (one per process with a control
/// channel).
#[derive(Debug)]
pub struct Authority {
    gateway_id: Arc<str>,
    key: Arc<GatewayKey>,
    records: RecordSink,
    sessions: Arc<Sessions>,
    clock: SharedClock,
    /// Told when a use finds a lease lapsed.
    lapsed: Arc<Notify>,
    /// The lease given at open and renewal, in milliseconds.
    lease_ms: AtomicU64,
    recent: Mutex<Recent>,
    /// Ends in progress, so the drain can wait for their reports.
    ending: TaskTracker,
    /// The process this one took over from, until it exits: an end here
    /// ends the authority's connections there too, before the report.
    predecessor: std::sync::OnceLock<Arc<crate::process::link::Predecessor>>,
}

#[derive(Debug, Default)]
struct Recent {
    reports: HashMap<(Arc<str>, u32), watch::Receiver<Option<Signed>>>,
    order: VecDeque<(Arc<str>, u32)>,
}

impl Authority {
    pub fn new(
        gateway_id: Arc<str>,
        key: Arc<GatewayKey>,
        records: RecordSink,
        sessions: Arc<Sessions>,
        clock: SharedClock,
        lease: Duration,
        lapsed: Arc<Notify>,
    ) -> Authority {
        Authority {
            gateway_id,
            key,
            records,
            sessions,
            clock,
            lapsed,
            lease_ms: AtomicU64::new(millis(lease)),
            recent: Mutex::new(Recent::default()),
            ending: TaskTracker::new(),
            predecessor: std::sync::OnceLock::new(),
        }
    }

    /// The process this one took over from: ends wait for it too.
    pub fn set_predecessor(&self, p: Arc<crate::process::link::Predecessor>) {
        let _ = self.predecessor.set(p);
    }

    /// The process this one took over from, while it runs.
    pub fn predecessor(&self) -> Option<&Arc<crate::process::link::Predecessor>> {
        self.predecessor.get().filter(|p| !p.is_gone())
    }

    /// Wait until no end is in progress (a handover's snapshot; nothing
    /// starts one meanwhile: the control channel and the lease watcher are
    /// stopped).
    pub async fn quiesce(&self) {
        self.ending.close();
        self.ending.wait().await;
        self.ending.reopen();
    }

    /// Every end this process remembers, with its report.
    pub fn recent_reports(&self) -> Vec<(Arc<str>, u32, Signed)> {
        let recent = self.recent.locked();
        recent
            .order
            .iter()
            .filter_map(|key| {
                let report = recent.reports.get(key)?.borrow().clone()?;
                Some((Arc::clone(&key.0), key.1, report))
            })
            .collect()
    }

    /// Remember an end the process this one took over from made.
    pub fn adopt_ended(&self, id: &str, attempt: u32, report: Signed) {
        let (_, rx) = watch::channel(Some(report));
        self.remember((Arc::from(id), attempt), rx);
    }

    /// A lease ending at `until` (a lease handed over).
    pub fn lease_until(&self, until: crate::session::lease::Millis) -> Lease {
        Lease::ending_at(
            Arc::clone(&self.clock),
            until,
            Some(Arc::clone(&self.lapsed)),
        )
    }

    /// The length of a lease given now.
    pub fn lease_length(&self) -> Duration {
        Duration::from_millis(self.lease_ms.load(Ordering::Relaxed))
    }

    /// Change the length of leases given from now on (a reload).
    pub fn set_lease_length(&self, length: Duration) {
        self.lease_ms.store(millis(length), Ordering::Relaxed);
    }

    /// A fresh lease for an authority opened now.
    pub fn new_lease(&self) -> Lease {
        Lease::new(
            Arc::clone(&self.clock),
            self.lease_length(),
            Some(Arc::clone(&self.lapsed)),
        )
    }

    /// The gateway process's instance id.
    pub fn instance(&self) -> &Arc<str> {
        self.records.instance()
    }

    /// End `session`'s authority for `reason` and return the signed drop
    /// report (see the module docs). The caller has taken the session out
    /// of the table, which makes it the one caller that ends it.
    pub async fn end(&self, session: Arc<Session>, reason: DropReason) -> Ended {
        let key = (Arc::clone(&session.id), session.attempt);
        let (tx, rx) = watch::channel(None);
        self.remember(key, rx);
        let (mut cut, mut withdrawn) = session.end_and_withdraw();
        if !session.connections_done(CONNECTIONS_BOUND).await {
            tracing::error!(
                session = %session.id,
                attempt = session.attempt,
                "connections of an ended authority are not all recorded in time; the drop report goes on"
            );
        }
        // Connections the process this one took over from still serves.
        if let Some(p) = self.predecessor() {
            let there = p.end(&session.id, session.attempt).await;
            cut += there.connections_closed;
            withdrawn += there.approvals_withdrawn;
        }
        // The session's last DNS counts go on the record before its drop
        // report, so its certificate has them.
        if let Some(json) = session.dns.take_record(
            &self.gateway_id,
            self.instance(),
            &session.id,
            session.attempt,
        ) {
            self.records.note(json).await;
        }
        let report = DropReport {
            gateway_id: self.gateway_id.to_string(),
            instance: self.instance().to_string(),
            session_id: session.id.to_string(),
            attempt: session.attempt,
            ca_digest: session.ca_digest().to_owned(),
            secrets: session.secret_names(),
            reason,
            at: crate::records::record::now(),
        };
        let signed = report.sign(&self.key);
        self.records.entry(report_entry(&signed)).await;
        tx.send_replace(Some(signed.clone()));
        metrics::counter!("gateway_session_drops_total", "reason" => reason.as_str()).increment(1);
        if reason == DropReason::LeaseExpired {
            metrics::counter!("gateway_leases_lapsed_total").increment(1);
        }
        tracing::info!(
            session = %session.id,
            attempt = session.attempt,
            reason = reason.as_str(),
            ca_digest = session.ca_digest(),
            connections_closed = cut,
            approvals_withdrawn = withdrawn,
            "session authority ended"
        );
        // The count only: the least lease left is the watcher's, which
        // walks every session at most once a second; a walk at every end
        // made ending all of a member's sessions quadratic.
        metrics::gauge!("gateway_sessions_open").set(self.sessions.open() as f64);
        Ended {
            report: signed,
            connections_closed: cut,
            approvals_withdrawn: withdrawn,
        }
    }

    /// End `session` for `reason` on a task of its own, and wait for it:
    /// the end goes on even if the caller is dropped (a control call cut
    /// short), and a drain or a handover waits for it.
    pub async fn end_tracked(
        self: &Arc<Self>,
        session: Arc<Session>,
        reason: DropReason,
    ) -> Option<Ended> {
        let this = Arc::clone(self);
        let task = self
            .ending
            .spawn(async move { this.end(session, reason).await });
        // `None` only if the end's task panicked: a bug, logged by the
        // runtime; a repeated close then finds no report.
        task.await.ok()
    }

    /// End `session` for `reason` on a task of its own (the drain waits for
    /// it): for ends nobody waits on, a lapse or a displaced authority.
    pub fn end_in_background(self: &Arc<Self>, session: Arc<Session>, reason: DropReason) {
        let this = Arc::clone(self);
        self.ending.spawn(async move {
            this.end(session, reason).await;
        });
    }

    fn remember(&self, key: (Arc<str>, u32), rx: watch::Receiver<Option<Signed>>) {
        let mut recent = self.recent.locked();
        if recent.reports.insert(key.clone(), rx).is_none() {
            recent.order.push_back(key);
        }
        while recent.order.len() > RECENT {
            if let Some(old) = recent.order.pop_front() {
                recent.reports.remove(&old);
            }
        }
    }

    /// The report of attempt `attempt` of session `id`, if this process
    /// ended it (waiting for an end in progress to sign it).
    pub async fn report_of(&self, id: &str, attempt: u32) -> Option<Signed> {
        let rx = {
            let recent = self.recent.locked();
            recent.reports.get(&(Arc::from(id), attempt)).cloned()
        };
        let mut rx = rx?;
        let signed = rx.wait_for(Option::is_some).await.ok()?.clone();
        signed
    }

    /// Whether this process ended attempt `attempt` of session `id`.
    pub fn was_ended(&self, id: &str, attempt: u32) -> bool {
        let recent = self.recent.locked();
        recent.reports.contains_key(&(Arc::from(id), attempt))
    }

    /// Renew the lease of attempt `attempt` of session `id` if this
    /// gateway holds it live; returns whether it did.
    pub fn renew(&self, id: &str, attempt: u32) -> bool {
        self.renew_from(id, attempt, Duration::ZERO)
    }

    /// [`Authority::renew`] with a renewal the control plane decided `age`
    /// ago: the lease runs from then ([`Lease::renew_from`]).
    ///
    /// [`Lease::renew_from`]: crate::session::lease::Lease::renew_from
    pub fn renew_from(&self, id: &str, attempt: u32, age: Duration) -> bool {
        let length = self.lease_length();
        self.sessions.find(id).is_some_and(|s| {
            s.attempt == attempt && !s.ended.is_cancelled() && s.lease.renew_from(length, age)
        })
    }

    /// Drop every authority whose lease lapses, as it lapses, until `stop`
    /// fires. Wakes at the earliest lease's end (at most every
    /// [`WATCH_AT_MOST`], so a clock that jumped or a process that was
    /// stopped is caught up at once), and whenever a use finds a lease
    /// lapsed.
    pub async fn watch_leases(self: Arc<Self>, stop: CancellationToken) {
        loop {
            let sweep = self.sessions.sweep(self.clock.now());
            for session in sweep.lapsed {
                tracing::warn!(
                    session = %session.id,
                    attempt = session.attempt,
                    "lease lapsed: nobody renewed it in time; dropping the authority"
                );
                self.end_in_background(session, DropReason::LeaseExpired);
            }
            let (open, least) = (sweep.open, sweep.least);
            metrics::gauge!("gateway_sessions_open").set(open as f64);
            metrics::gauge!("gateway_lease_seconds_left_min")
                .set(least.map_or(-1.0, |d| d.as_secs_f64()));
            let next = least
                .unwrap_or(WATCH_AT_MOST)
                .clamp(Duration::from_millis(1), WATCH_AT_MOST);
            tokio::select! {
                () = stop.cancelled() => return,
                () = self.lapsed.notified() => {}
                () = tokio::time::sleep(next) => {}
            }
        }
    }

    /// End every authority the control plane opened (reason `shutdown`),
    /// and wait for every end in progress: at the drain, once connections
    /// are done, so the reports are sealed before the process exits.
    pub async fn shutdown(self: &Arc<Self>) {
        for session in self.sessions.remove_all() {
            if session.lease.is_leased() {
                self.end_in_background(session, DropReason::Shutdown);
            } else {
                session.end_and_withdraw();
            }
        }
        self.ending.close();
        self.ending.wait().await;
    }
}

/// The lease watcher ([`Authority::watch_leases`]) as a task a handover
/// stops while it hands over, and starts again if the handover fails.
#[derive(Debug)]
pub struct LeaseWatcher {
    authority: Arc<Authority>,
    running: Mutex<Option<CancellationToken>>,
}

impl LeaseWatcher {
    pub fn new(authority: Arc<Authority>) -> LeaseWatcher {
        LeaseWatcher {
            authority,
            running: Mutex::new(None),
        }
    }

    /// Watch, unless watching already.
    pub fn start(&self) {
        let mut running = self.running.locked();
        if running.is_none() {
            let stop = CancellationToken::new();
            tokio::spawn(Arc::clone(&self.authority).watch_leases(stop.clone()));
            *running = Some(stop);
        }
    }

    /// Stop watching.
    pub fn stop(&self) {
        if let Some(stop) = self.running.locked().take() {
            stop.cancel();
        }
    }
}

/// What an end did.
#[derive(Debug, Clone)]
pub struct Ended {
    pub report: Signed,
    pub connections_closed: u32,
    pub approvals_withdrawn: u32,
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::records::journal::{self, JournalSetup, WriterConfig};
    use crate::session::lease::ManualClock;
    use crate::session::sessions::{SessionSpec, UpstreamSettings};

    struct Fixture {
        _dir: tempfile::TempDir,
        clock: Arc<ManualClock>,
        sessions: Arc<Sessions>,
        authority: Arc<Authority>,
        key: Arc<GatewayKey>,
        segments: tokio::sync::mpsc::Receiver<crate::records::journal::Segment>,
    }

    fn fixture() -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        let gateway: Arc<str> = Arc::from("gw-a");
        let instance: Arc<str> = Arc::from("00000000000000aa");
        let journal_dir = dir.path().join("journal");
        let recovered = journal::recover(&journal_dir, 0, &gateway, &instance).unwrap();
        let (tx, segments) = tokio::sync::mpsc::channel(64);
        let (records, _writer) = journal::start(WriterConfig {
            records_path: dir.path().join("records.jsonl"),
            journal: Some(JournalSetup {
                dir: journal_dir,
                recovered,
                sealer: tx,
                max_records: 1,
                interval: Duration::from_secs(3600),
                sync: crate::records::journal::DataSync::disk(),
            }),
            gateway_id: Arc::clone(&gateway),
            instance,
            first_conn: 1,
        })
        .unwrap();
        let clock = ManualClock::new(1_000_000);
        let sessions = Arc::new(Sessions::default());
        let key = Arc::new(GatewayKey::generate().unwrap());
        let authority = Arc::new(Authority::new(
            gateway,
            Arc::clone(&key),
            records,
            Arc::clone(&sessions),
            clock.clone(),
            Duration::from_secs(10),
            Arc::new(Notify::new()),
        ));
        Fixture {
            _dir: dir,
            clock,
            sessions,
            authority,
            key,
            segments,
        }
    }

    fn open(f: &Fixture, id: &str, attempt: u32) -> Arc<Session> {
        let upstream = UpstreamSettings::new(
            crate::tls::client_config(&[]),
            443,
            Duration::from_secs(1),
            crate::session::share::Limits::default(),
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
        let s = Arc::new(
            Session::open(spec, "gw-a", &upstream, None, f.authority.new_lease()).unwrap(),
        );
        f.sessions
            .replace(&["10.0.0.1".parse().unwrap()], Arc::clone(&s));
        s
    }

    /// The report entries of the next `n` segments handed to the sealer
    /// (one entry each). The writer is a thread of its own: this waits on
    /// the channel, with no timer, so paused time does not run ahead of it.
    async fn reports(f: &mut Fixture, n: usize) -> Vec<talos_certs::DropReport> {
        let mut out = Vec::new();
        for _ in 0..n {
            let seg = f.segments.recv().await.expect("a segment");
            for e in seg.entries {
                let v: serde_json::Value = serde_json::from_slice(&e).unwrap();
                if let Some(r) = v.get("report") {
                    let signed: Signed = serde_json::from_value(r.clone()).unwrap();
                    out.push(
                        talos_certs::verify_drop_report(&f.key.public_key(), &signed).unwrap(),
                    );
                }
            }
        }
        out
    }

    #[tokio::test(start_paused = true)]
    async fn a_lease_nobody_renews_ends_the_authority_with_a_signed_report() {
        let mut f = fixture();
        let s = open(&f, "sess-1", 2);
        let stop = CancellationToken::new();
        let watcher = tokio::spawn(Arc::clone(&f.authority).watch_leases(stop.clone()));
        // Renewed at 8 s: still live at 15 s.
        f.clock.advance(Duration::from_secs(8));
        assert!(f.authority.renew("sess-1", 2));
        assert!(
            !f.authority.renew("sess-1", 1),
            "another attempt is not renewed"
        );
        f.clock.advance(Duration::from_secs(7));
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert!(f.sessions.find("sess-1").is_some());
        assert!(s.usable());
        // Past the renewed lease: a use finds it lapsed, the watcher ends it.
        f.clock.advance(Duration::from_secs(4));
        assert!(!s.lease.live());
        // The watcher ends it; its report comes once the writer has it on
        // disk (no timer here: the writer is a thread of its own).
        tokio::task::yield_now().await;
        let report = loop {
            if let Some(r) = f.authority.report_of("sess-1", 2).await {
                break r;
            }
            tokio::task::yield_now().await;
        };
        assert!(f.sessions.find("sess-1").is_none());
        assert!(s.ended.is_cancelled());
        let signed: talos_certs::DropReport =
            talos_certs::verify_drop_report(&f.key.public_key(), &report).unwrap();
        assert_eq!(signed.reason, DropReason::LeaseExpired);
        assert_eq!(signed.attempt, 2);
        assert_eq!(signed.instance, "00000000000000aa");
        // The same report went into the batch chain.
        assert_eq!(reports(&mut f, 1).await, [signed]);
        // A renewal never brings it back, and an open of that attempt is
        // refused.
        assert!(!f.authority.renew("sess-1", 2));
        assert!(f.authority.was_ended("sess-1", 2));
        stop.cancel();
        watcher.await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn an_end_waits_for_the_connections_records_then_reports() {
        let mut f = fixture();
        let s = open(&f, "sess-2", 1);
        let live = s.track();
        let removed = f.sessions.remove("sess-2", 1).unwrap();
        let authority = Arc::clone(&f.authority);
        let ending = tokio::spawn(async move { authority.end(removed, DropReason::End).await });
        tokio::task::yield_now().await;
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(s.ended.is_cancelled(), "the connections are cut at once");
        assert!(!ending.is_finished(), "the report waits for the connection");
        assert!(f.segments.try_recv().is_err(), "no report yet");
        // A repeated close meanwhile waits for the same report.
        let again = {
            let a = Arc::clone(&f.authority);
            tokio::spawn(async move { a.report_of("sess-2", 1).await })
        };
        drop(live);
        let ended = ending.await.unwrap();
        assert_eq!(ended.connections_closed, 1);
        assert_eq!(again.await.unwrap(), Some(ended.report.clone()));
        assert_eq!(reports(&mut f, 1).await.len(), 1);
    }
}
