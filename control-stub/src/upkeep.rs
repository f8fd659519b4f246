//! What `control-stub serve` does while nobody types a command: the
//! control plane's long-running part.
//!
//! Per member given, a loop of its own ([`Upkeep::keep_members`], every
//! `--renew-ms`, on a thread, a store connection and a control channel
//! client of that member's own, so that a member that hangs — each call to
//! it waits out a connect or call timeout — never delays the renewals of
//! another). A renewal round waits for no other writer: what it writes of
//! a member (when it was last seen, its last error) is written only if the
//! store's write lock is free at that moment ([`Store::try_write`]), else
//! by the next round, and a member already registered with its key is only
//! read. With replicas over PostgreSQL a frozen replica can hold the write
//! lock for 5 s at a time, and once for each of its connections queued for
//! it; leases must not wait that out:
//!
//! 1. **Who the members are**: each gateway given is
//!    asked `Describe`; a new one is registered (first contact), and the
//!    process instance and lease each runs are recorded.
//! 2. **Leases and forwarding**: one `RenewLeases` call per member,
//!    listing every (session, attempt) it holds live by the store (a
//!    running session's latest attempt, a CA of that member not yet
//!    destroyed). A renewal never brings back an authority the member
//!    closed, replaced or let lapse; the member says so (`not_held`), and
//!    its report in its batch chain settles it. The same call carries the
//!    member's whole **forwarding table**, read in the same transaction
//!    ([`renewals`]): each running session's latest attempt that other
//!    members hold live and this one does not, with its tenant, source
//!    addresses and holders. Such a member — restarted without a handover
//!    (its start report destroyed its CAs), unreachable at the open (no CA
//!    made there), or whose lease lapsed while its peer kept the session —
//!    would otherwise refuse the session's connections that reach it
//!    `unknown_source` until the next attempt; with the entry it hands
//!    them, untouched, to a holder, which judges them as its own. The
//!    table replaces the member's at each renewal, and each entry lapses
//!    with the member's lease if not given again. Nothing is sent to
//!    withdraw one: a stop, pause, interruption or Revoke All closes the
//!    authorities on the holders (so the session's connections, forwarded
//!    ones included, end there), the session is no longer running, and
//!    the next renewal leaves its entry out.
//!
//! And one loop ([`Upkeep::tick`], every `--tick-ms`) for the rest:
//!
//! 3. **Closes owed**: every close due is asked again, each member at once
//!    (each member's call as soon as it is connected);
//!    a failure is asked again after a delay that doubles up to a minute
//!    ([`crate::confirm`]). The owed closes live in the store, so they
//!    survive a restart of `serve`.
//! 4. **The time-driven events**, against the clock passed in (tests move
//!    it), each an event the state machine decides ([`crate::machine`];
//!    one it refuses — the session moved on since it was found due — is
//!    left alone): an open in flight for longer than
//!    [`limits::OPEN_DEADLINE`] is given up (`open_timed_out`: the process
//!    that committed it stopped before it recorded the members' answers;
//!    see [`crate::lifecycle`]); and the spec's: an interrupted session in
//!    mode commands that has not recovered within 30 minutes ends
//!    (`interruption_lost`, outcome `outcome_unknown`); a session paused
//!    for 7 days ends (`paused_too_long`); a running session whose
//!    compute — the running time of all its attempts, on the clock passed
//!    in ([`crate::machine::compute_used`]) — has reached its hard stop
//!    ends (`stop_after`, the reset running as for any end); a running
//!    session in mode commands idle for its idle timeout (no start,
//!    resume, recovery or attach since) pauses or ends (`idle_timeout`),
//!    as its `idle_action` says. Each is claimed in the store: the machine
//!    decides it inside the write transaction that commits it, from the
//!    state stored then, so of two replicas that both find it due the
//!    second finds the session moved on and does nothing (a compute used
//!    only grows while the session runs, so a due found on an older read
//!    is still due).
//! 5. **Certificates**: every session over whose certificate is not issued
//!    has its reset re-run and, once complete, its certificate issued
//!    ([`crate::certificate::issue`]).
//! 6. **Metrics**: the gauges below, from the store.
//!
//! # Metrics
//!
//! `stub_closes_pending`, `stub_sessions{state}`,
//! `stub_certificates_waiting` (gauges, each tick);
//! `stub_close_attempts_total{gateway,result}`,
//! `stub_lease_renewals_total{gateway,result}`, `stub_gateway_up{gateway}`,
//! `stub_forwarding_entries{gateway}` (the entries sent in the member's
//! last renewal it answered) (here); `stub_batches_accepted_total{gateway}`,
//! `stub_batches_rejected_total{gateway,reason}`,
//! `stub_reports_accepted_total{gateway,kind}` (the batch consumer);
//! `stub_batches_in_intake` (gauge: batches the batch intake took and has
//! not yet committed or refused; `crate::server`);
//! `stub_certificates_issued_total` (the certificate).

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, SystemTime};

use crate::error::Error;
use crate::lifecycle::{ask_closes, Lifecycle};
use crate::link::{Forwarding, GatewayLink, MemberRenewal, ReportVerifier};
use crate::machine::Event;
use crate::model::{limits, AttemptEnd, CloseAttempt, IdleAction, Renewal, State};
use crate::store::{Attempt, CaEvent, Session, Store, Tx};

/// How often the loop looks, by default: closes owed are asked at most
/// this late, and time-driven events happen within it.
pub const DEFAULT_TICK: Duration = Duration::from_secs(1);

/// How often leases are renewed, by default: 10 s, a sixth of the
/// gateway's default lease (60 s), so five renewals in a row can fail (a
/// control plane restarting, a network blip) before any authority lapses.
pub const DEFAULT_RENEW: Duration = Duration::from_secs(10);

/// `t` in milliseconds since the Unix epoch (0 before it).
fn unix_ms(t: SystemTime) -> u64 {
    t.duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// What one tick did, for logs and tests.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct TickReport {
    /// Members that answered `Describe`.
    pub members_up: Vec<String>,
    /// (member, error) for those that did not.
    pub members_down: Vec<(String, String)>,
    /// Leases renewed, and those a member said it does not hold.
    pub renewed: usize,
    pub not_held: Vec<(String, String, u32)>,
    /// Per member that answered its renewal: (member, forwarding entries
    /// sent, entries it took).
    pub forwarding: Vec<(String, usize, u32)>,
    /// Closes asked again, and those confirmed by this tick.
    pub closes_asked: usize,
    pub closes_confirmed: usize,
    /// Sessions a time-driven event changed: (session, what happened).
    pub events: Vec<(String, String)>,
    /// Certificates issued this tick.
    pub issued: Vec<String>,
    /// Proposals answered with the decision on their first use's card.
    pub answered: Vec<String>,
}

/// The loop's state: its store connection and control channel client.
pub struct Upkeep<'a> {
    pub store: &'a mut Store,
    pub link: &'a dyn GatewayLink,
    pub verifier: &'a dyn ReportVerifier,
    /// The control plane's key, to sign certificates with; none: nothing is
    /// issued (the certificates wait).
    pub plane_key: Option<&'a talos_certs::GatewayKey>,
    /// The approval relay's key: it signs the decisions that answer
    /// proposals joined to a decided card (one card per first use,
    /// [`crate::relay::answer_joined`]); its public half is what opens
    /// carry. None: joined proposals wait for a decision made elsewhere.
    pub relay_key: Option<&'a talos_certs::GatewayKey>,
}

impl std::fmt::Debug for Upkeep<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Upkeep")
            .field("store", &self.store.path())
            .finish_non_exhaustive()
    }
}

impl Upkeep<'_> {
    /// One round of the loop at `now` (see the module docs); `renew`: also
    /// describe the members and renew their leases.
    pub fn tick(&mut self, now: SystemTime, renew: bool) -> Result<TickReport, Error> {
        let mut report = TickReport::default();
        if renew {
            self.members(&mut report)?;
            self.renew(&mut report)?;
        }
        self.retry_closes(now, &mut report)?;
        // Never in the way of the rest of the round (time-driven events,
        // certificates): what fails is tried again next round.
        if let Err(e) = self.answer_joined(&mut report) {
            log("joined_unanswered", "", &e.to_string());
        }
        self.time_events(now, &mut report)?;
        self.certificates(&mut report)?;
        self.gauges()?;
        Ok(report)
    }

    /// Describe the link's members and renew their leases: what `serve`
    /// does every `--renew-ms` for each member, on a thread of that
    /// member's own (so a member that hangs never delays another's
    /// renewals).
    pub fn keep_members(&mut self) -> Result<TickReport, Error> {
        let mut report = TickReport::default();
        self.members(&mut report)?;
        self.renew(&mut report)?;
        Ok(report)
    }

    /// Answer the proposals joined to a card decided since (a first use
    /// proposed by another member after the person approved the card, or
    /// one whose member was out of reach when the card was decided); make
    /// those whose card expired or was withdrawn cards of their own.
    fn answer_joined(&mut self, report: &mut TickReport) -> Result<(), Error> {
        if self.store.read(|tx| tx.joined_pending())?.is_empty() {
            return Ok(());
        }
        crate::relay::expire_overdue(self.store)?;
        if let Some(key) = self.relay_key {
            let answered = crate::relay::answer_joined(self.store, self.link, key, None)?;
            report
                .answered
                .extend(answered.into_iter().map(|a| a.proposal_id));
        }
        Ok(())
    }

    /// Describe every member; register new ones, note instances.
    fn members(&mut self, report: &mut TickReport) -> Result<(), Error> {
        for reply in self.link.describe() {
            match reply.result {
                Ok(d) => {
                    crate::series::member(&d.gateway_id);
                    metrics::gauge!("stub_gateway_up", "gateway" => d.gateway_id.clone()).set(1.0);
                    if !d.public_key_hex.is_empty() {
                        if let Err(e) = self
                            .store
                            .register_gateway(&d.gateway_id, &d.public_key_hex)
                        {
                            // A known id with another key: its reports and
                            // batches are not trusted; say so, go on.
                            log("gateway_key_conflict", &d.gateway_id, &e.to_string());
                            self.store.try_write(|tx| {
                                tx.gateway_unreached(&d.gateway_id, &e.to_string())
                            })?;
                            continue;
                        }
                        self.store.keep_key_binding(
                            &d.gateway_id,
                            &d.public_key_hex,
                            &d.key_binding,
                        )?;
                    }
                    let at = crate::store::now();
                    self.store.try_write(|tx| {
                        tx.gateway_seen(&d.gateway_id, &d.instance, d.lease_ms, &at)
                    })?;
                    report.members_up.push(d.gateway_id);
                }
                Err(e) => {
                    metrics::gauge!("stub_gateway_up", "gateway" => reply.member.clone()).set(0.0);
                    self.store
                        .try_write(|tx| tx.gateway_unreached(&reply.member, &e.to_string()))?;
                    report.members_down.push((reply.member, e.to_string()));
                }
            }
        }
        Ok(())
    }

    /// Renew, per member, the leases of what it holds live by the store,
    /// and give it its forwarding table (see [`renewals`]).
    fn renew(&mut self, report: &mut TickReport) -> Result<(), Error> {
        // Taken before the read: the leases run from no later than the
        // store said what they renew.
        let read_at = unix_ms(SystemTime::now());
        let mut renewals = self.store.read(|tx| {
            let members: Vec<String> = tx.gateway_list()?.into_iter().map(|g| g.id).collect();
            let sessions = tx.running_sessions_in_full()?;
            Ok(renewals(&members, &sessions))
        })?;
        for r in &mut renewals {
            r.read_at_unix_ms = read_at;
        }
        for reply in self.link.renew(&renewals) {
            match reply.result {
                Ok(r) => {
                    metrics::counter!("stub_lease_renewals_total", "gateway" => reply.member.clone(), "result" => Renewal::Ok.as_str())
                        .increment(1);
                    let sent = renewals
                        .iter()
                        .find(|m| m.gateway == reply.member)
                        .map_or(0, |m| m.forwarding.len());
                    metrics::gauge!("stub_forwarding_entries", "gateway" => reply.member.clone())
                        .set(sent as f64);
                    report
                        .forwarding
                        .push((reply.member.clone(), sent, r.forwarding_taken));
                    report.renewed += r.renewed.len();
                    for (s, a) in r.not_held {
                        report.not_held.push((reply.member.clone(), s, a));
                    }
                    let at = crate::store::now();
                    self.store.try_write(|tx| {
                        tx.gateway_seen(&reply.member, &r.instance, r.lease_ms, &at)
                    })?;
                }
                Err(e) => {
                    metrics::counter!("stub_lease_renewals_total", "gateway" => reply.member.clone(), "result" => Renewal::Failed.as_str())
                        .increment(1);
                    log("lease_renewal_failed", &reply.member, &e.to_string());
                }
            }
        }
        Ok(())
    }

    /// Ask again every close that is due.
    fn retry_closes(&mut self, now: SystemTime, report: &mut TickReport) -> Result<(), Error> {
        let stamp = humantime::format_rfc3339_millis(now).to_string();
        let due = self.store.read(|tx| tx.due_closes(&stamp))?;
        let mut by_session: BTreeMap<String, Vec<crate::store::CloseTask>> = BTreeMap::new();
        for d in due {
            by_session.entry(d.session_id).or_default().push(d.task);
        }
        for (session_id, tasks) in by_session {
            report.closes_asked += tasks.len();
            ask_closes(
                self.store,
                self.link,
                self.verifier,
                &session_id,
                &tasks,
                now,
            )?;
            let after = self.store.read(|tx| tx.close_tasks(&session_id))?;
            for t in &tasks {
                let confirmed = after.iter().any(|a| {
                    a.attempt == t.attempt
                        && a.gateway_id == t.gateway_id
                        && a.confirmed_at.is_some()
                });
                let result = if confirmed {
                    CloseAttempt::Confirmed
                } else {
                    CloseAttempt::Owed
                };
                metrics::counter!("stub_close_attempts_total", "gateway" => t.gateway_id.clone(), "result" => result.as_str())
                    .increment(1);
                if confirmed {
                    report.closes_confirmed += 1;
                }
            }
        }
        Ok(())
    }

    /// The spec's time-driven events at `now`, each claimed in the store
    /// (see the module's docs): what is due is read in one snapshot, then
    /// each is decided and committed on its own.
    fn time_events(&mut self, now: SystemTime, report: &mut TickReport) -> Result<(), Error> {
        let due = self.store.read(|tx| Due::read(tx, now))?;
        self.authority_lost(due.lost, report)?;
        self.opens_timed_out(due.opens, now, report)?;
        self.waits_over(due.interrupted, due.paused, now, report)?;
        let stopped = self.hard_stops(&due.running, &due.used, report)?;
        let idle = due.running.into_iter().filter(|s| !stopped.contains(&s.id));
        self.idle_timeouts(idle, now, report)
    }

    /// Nothing serves these: every member's authority of the running
    /// attempt is gone. The cause is the destroy reasons (`lease_expired`,
    /// say).
    fn authority_lost(
        &mut self,
        lost: Vec<(String, Vec<String>)>,
        report: &mut TickReport,
    ) -> Result<(), Error> {
        for (id, reasons) in lost {
            let cause = if reasons.is_empty() {
                "authority_lost".to_owned()
            } else {
                reasons.join(",")
            };
            if let Some(t) = self.life().authority_lost(&id, &cause)? {
                report.events.push((
                    id,
                    format!(
                        "authority_lost ({cause}): every member's authority of the running attempt is gone; now {} at attempt {}",
                        t.state.as_str(),
                        t.attempt
                    ),
                ));
            }
        }
        Ok(())
    }

    /// Opens in flight past [`limits::OPEN_DEADLINE`], given up.
    fn opens_timed_out(
        &mut self,
        opens: Vec<(String, u32, String)>,
        now: SystemTime,
        report: &mut TickReport,
    ) -> Result<(), Error> {
        for (id, n, began) in opens {
            if since(now, Some(&began)).is_some_and(|d| d >= limits::OPEN_DEADLINE)
                && self.life().give_up_open(&id, n)?
            {
                report.events.push((
                    id,
                    format!("open_timed_out: attempt {n} had no answers within 60 s"),
                ));
            }
        }
        Ok(())
    }

    /// Interrupted sessions not recovered within 30 minutes, and sessions
    /// paused for 7 days, ended.
    fn waits_over(
        &mut self,
        interrupted: Vec<(Session, Option<String>)>,
        paused: Vec<(Session, Option<String>)>,
        now: SystemTime,
        report: &mut TickReport,
    ) -> Result<(), Error> {
        for (s, at) in interrupted {
            if since(now, at.as_deref()).is_some_and(|d| d >= limits::INTERRUPTION_WAIT)
                && self
                    .life()
                    .time_event(&s.id, Event::InterruptionLost)?
                    .is_some()
            {
                report.events.push((
                    s.id,
                    "interruption_lost: not recovered within 30 minutes".into(),
                ));
            }
        }
        for (s, at) in paused {
            if since(now, at.as_deref()).is_some_and(|d| d >= limits::PAUSE_LIMIT)
                && self
                    .life()
                    .time_event(&s.id, Event::PausedTooLong)?
                    .is_some()
            {
                report
                    .events
                    .push((s.id, "paused_too_long: paused for 7 days".into()));
            }
        }
        Ok(())
    }

    /// Running sessions whose compute (`used`) has reached their hard
    /// stop, ended; the ids of those it ended.
    fn hard_stops(
        &mut self,
        running: &[Session],
        used: &BTreeMap<String, Duration>,
        report: &mut TickReport,
    ) -> Result<BTreeSet<String>, Error> {
        let mut stopped = BTreeSet::new();
        for s in running {
            let (Some(limit), Some(used)) = (s.stop_after_seconds, used.get(&s.id)) else {
                continue;
            };
            if *used >= Duration::from_secs(u64::from(limit))
                && self.life().time_event(&s.id, Event::StopAfter)?.is_some()
            {
                stopped.insert(s.id.clone());
                report.events.push((
                    s.id.clone(),
                    format!(
                        "stop_after: {} s of compute used, the hard stop is {limit} s",
                        used.as_secs()
                    ),
                ));
            }
        }
        Ok(stopped)
    }

    /// Running sessions in mode commands idle for their idle timeout,
    /// paused or ended as their `idle_action` says.
    fn idle_timeouts(
        &mut self,
        running: impl Iterator<Item = Session>,
        now: SystemTime,
        report: &mut TickReport,
    ) -> Result<(), Error> {
        for s in running {
            let (Some(secs), Some(action)) = (s.idle_timeout_seconds, s.idle_action) else {
                continue;
            };
            let idle = since(now, s.last_activity_at.as_deref().or(Some(&s.created_at)));
            if idle.is_none_or(|d| d < Duration::from_secs(u64::from(secs))) {
                continue;
            }
            let (event, what) = match action {
                IdleAction::Pause => (Event::IdleTimeoutPause, "idle_timeout_pause"),
                IdleAction::End => (Event::IdleTimeoutEnd, "idle_timeout_end"),
            };
            if self.life().time_event(&s.id, event)?.is_some() {
                report.events.push((s.id, format!("{what} after {secs} s")));
            }
        }
        Ok(())
    }

    /// Re-run the reset of every session over without a certificate, and
    /// issue what can be issued.
    fn certificates(&mut self, report: &mut TickReport) -> Result<(), Error> {
        let owed = self.store.read(|tx| tx.certificates_owed())?;
        for id in owed {
            self.store.write(|tx| crate::confirm::reevaluate(tx, &id))?;
            if let Some(key) = self.plane_key {
                let before = self
                    .store
                    .read(|tx| Ok(tx.issued_certificate(&id)?.is_some()))?;
                if !before && crate::certificate::issue(self.store, &id, key)? {
                    report.issued.push(id);
                }
            }
        }
        Ok(())
    }

    fn gauges(&mut self) -> Result<(), Error> {
        let (owed, counts, waiting) = self.store.read(|tx| {
            Ok((
                tx.closes_owed()?,
                tx.session_counts()?,
                tx.certificates_owed()?.len(),
            ))
        })?;
        metrics::gauge!("stub_closes_pending").set(owed as f64);
        for state in State::ALL {
            let n = counts
                .iter()
                .find(|(s, _)| s == state)
                .map_or(0, |(_, n)| *n);
            metrics::gauge!("stub_sessions", "state" => state.as_str()).set(n as f64);
        }
        metrics::gauge!("stub_certificates_waiting").set(waiting as f64);
        Ok(())
    }

    fn life(&mut self) -> Lifecycle<'_> {
        Lifecycle::new(self.store, self.link, self.verifier)
            .with_relay_key(self.relay_key.map(talos_certs::GatewayKey::public_key))
    }
}

/// How long before `now` the RFC 3339 `stamp` was (none: no stamp, one
/// that does not parse, or one after `now`).
fn since(now: SystemTime, stamp: Option<&str>) -> Option<Duration> {
    let t = humantime::parse_rfc3339(stamp?).ok()?;
    now.duration_since(t).ok()
}

/// What the time-driven events may find due, read in one snapshot.
struct Due {
    /// Opens in flight: (session, attempt, when it began).
    opens: Vec<(String, u32, String)>,
    /// Interrupted sessions, each with when its last attempt ended.
    interrupted: Vec<(Session, Option<String>)>,
    /// Paused sessions, each with when the pause began (the end of the
    /// last attempt that ran).
    paused: Vec<(Session, Option<String>)>,
    running: Vec<Session>,
    /// Running sessions nothing serves, with the destroy reasons.
    lost: Vec<(String, Vec<String>)>,
    /// The compute each running session with a hard stop has used by
    /// `now`: its attempts' running time (a pause, an interruption, an
    /// open in flight use none).
    used: BTreeMap<String, Duration>,
}

impl Due {
    fn read(tx: &Tx<'_>, now: SystemTime) -> Result<Due, Error> {
        let mut interrupted = Vec::new();
        for s in tx.sessions_in(&[State::Interrupted])? {
            let at = tx.attempts(&s.id)?.last().and_then(|a| a.ended_at.clone());
            interrupted.push((s, at));
        }
        let mut paused = Vec::new();
        for s in tx.sessions_in(&[State::Paused])? {
            let at = tx
                .attempts(&s.id)?
                .into_iter()
                .rev()
                .find(|a| a.end_cause == Some(crate::model::AttemptEnd::Paused))
                .and_then(|a| a.ended_at);
            paused.push((s, at));
        }
        let running = tx.sessions_in(&[State::Running])?;
        let mut used = BTreeMap::new();
        for s in running.iter().filter(|s| s.stop_after_seconds.is_some()) {
            let attempts = tx.attempts(&s.id)?;
            let spans = attempts.iter().filter_map(Attempt::running_span);
            used.insert(s.id.clone(), crate::machine::compute_used(spans, now));
        }
        Ok(Due {
            opens: tx.opens_in_flight()?,
            interrupted,
            paused,
            running,
            lost: tx.unserved_sessions()?,
            used,
        })
    }
}

/// What each member is told at a renewal, from the store's running
/// sessions (each with its attempts and the CAs made for it) and the
/// members it knows (`members`; a member named only by a CA is told too).
///
/// For each session in state running, its latest attempt (the last that
/// did not end `start_failed`) and the members holding it live (a CA made
/// there for that attempt, not destroyed):
///
/// - each holder's leases list (session, attempt);
/// - each other member's forwarding table has an entry naming the holders
///   (sorted), when there is one: that member's connections of the session
///   go, untouched, to a holder. So a member that restarted without a
///   handover (its start report destroyed its CAs), was unreachable at the
///   open (no CA made there) or let its lease lapse (its drop report
///   destroyed the CA) while its peer kept the session serves the
///   session's connections through the peer until the next attempt.
///
/// Members come out sorted by id, each once, with an empty table when it
/// forwards nothing (a renewal replaces the member's whole table).
pub fn renewals(
    members: &[String],
    sessions: &[(Session, Vec<Attempt>, Vec<CaEvent>)],
) -> Vec<MemberRenewal> {
    fn entry<'m>(
        by_member: &'m mut BTreeMap<String, MemberRenewal>,
        id: &str,
    ) -> &'m mut MemberRenewal {
        by_member
            .entry(id.to_owned())
            .or_insert_with(|| MemberRenewal {
                gateway: id.to_owned(),
                ..MemberRenewal::default()
            })
    }
    let mut by_member: BTreeMap<String, MemberRenewal> = BTreeMap::new();
    for id in members {
        entry(&mut by_member, id);
    }
    let mut live = Vec::new();
    for (session, attempts, cas) in sessions {
        if session.state != State::Running {
            continue;
        }
        let Some(latest) = attempts
            .iter()
            .rev()
            .find(|a| a.end_cause != Some(AttemptEnd::StartFailed))
        else {
            continue;
        };
        let holders: BTreeSet<&str> = cas
            .iter()
            .filter(|c| c.attempt == latest.n && c.destroyed_at.is_none())
            .map(|c| c.gateway_id.as_str())
            .collect();
        for h in &holders {
            entry(&mut by_member, h)
                .leases
                .push((session.id.clone(), latest.n));
        }
        live.push((session, latest.n, holders));
    }
    for m in by_member.values_mut() {
        for (session, attempt, holders) in &live {
            if holders.is_empty() || holders.contains(m.gateway.as_str()) {
                continue;
            }
            m.forwarding.push(Forwarding {
                session_id: session.id.clone(),
                attempt: *attempt,
                tenant: session.tenant.clone(),
                sources: session.sources.clone(),
                holders: holders.iter().map(|h| (*h).to_owned()).collect(),
            });
        }
    }
    by_member.into_values().collect()
}

/// One JSON line on standard error.
fn log(event: &str, gateway: &str, detail: &str) {
    eprintln!(
        "{}",
        serde_json::json!({"upkeep": event, "gateway": gateway, "detail": detail})
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{CloseReason, Mode, OpenCause};

    fn session(id: &str, state: State) -> Session {
        Session {
            id: id.into(),
            tenant: "acme".into(),
            mode: Mode::Commands,
            state,
            created_at: "2026-12-01T00:00:00.000Z".into(),
            ended_at: None,
            end_reason: None,
            outcome: None,
            allow: vec!["api.example.com".into()],
            attach: Vec::new(),
            sources: vec!["10.1.0.2".parse().unwrap(), "fd00::2".parse().unwrap()],
            idle_timeout_seconds: None,
            idle_action: None,
            last_activity_at: None,
            stop_after_seconds: None,
        }
    }

    fn attempt(n: u32, end_cause: Option<AttemptEnd>) -> Attempt {
        Attempt {
            n,
            cause: if n == 1 {
                OpenCause::Launch
            } else {
                OpenCause::Resume
            },
            started_at: "2026-12-01T00:00:00.000Z".into(),
            ended_at: end_cause.map(|_| "2026-12-01T00:01:00.000Z".into()),
            end_cause,
            allowlist: vec!["api.example.com".into()],
            attachments: Vec::new(),
            lock: Vec::new(),
            relay_public_key: None,
            passthrough: Vec::new(),
            running_at: end_cause
                .is_none_or(|e| e != AttemptEnd::StartFailed)
                .then(|| "2026-12-01T00:00:01.000Z".into()),
            lab_approvals: false,
        }
    }

    /// A CA of `gateway` for `attempt`; `destroyed`: why it is gone.
    fn ca(gateway: &str, attempt: u32, destroyed: Option<CloseReason>) -> CaEvent {
        CaEvent {
            attempt,
            gateway_id: gateway.into(),
            digest: format!("{gateway}-{attempt}"),
            cert_pem: String::new(),
            made_at: "2026-12-01T00:00:00.000Z".into(),
            instance: Some("00000000000000aa".into()),
            destroyed_at: destroyed.map(|_| "2026-12-01T00:02:00.000Z".into()),
            destroy_reason: destroyed,
            destroy_report: None,
        }
    }

    fn pair() -> Vec<String> {
        vec!["gw-a".into(), "gw-b".into()]
    }

    fn of<'r>(renewals: &'r [MemberRenewal], id: &str) -> &'r MemberRenewal {
        renewals.iter().find(|r| r.gateway == id).unwrap()
    }

    #[test]
    fn a_member_restarted_without_a_handover_forwards_to_its_peer() {
        // gw-a's start report destroyed its CA; gw-b keeps the session.
        let sessions = [(
            session("sbx-1", State::Running),
            vec![attempt(1, None)],
            vec![
                ca("gw-a", 1, Some(CloseReason::GatewayRestarted)),
                ca("gw-b", 1, None),
            ],
        )];
        let r = renewals(&pair(), &sessions);
        assert_eq!(r.len(), 2);
        let a = of(&r, "gw-a");
        assert!(a.leases.is_empty());
        assert_eq!(
            a.forwarding,
            [Forwarding {
                session_id: "sbx-1".into(),
                attempt: 1,
                tenant: "acme".into(),
                sources: vec!["10.1.0.2".parse().unwrap(), "fd00::2".parse().unwrap()],
                holders: vec!["gw-b".into()],
            }]
        );
        let b = of(&r, "gw-b");
        assert_eq!(b.leases, [("sbx-1".to_owned(), 1)]);
        assert!(b.forwarding.is_empty());
    }

    #[test]
    fn a_member_unreachable_at_the_open_forwards_the_latest_attempt() {
        // Attempt 2 (a resume) was made on gw-b only; attempt 3 failed to
        // start and does not count.
        let sessions = [(
            session("sbx-1", State::Running),
            vec![
                attempt(1, Some(AttemptEnd::Paused)),
                attempt(2, None),
                attempt(3, Some(AttemptEnd::StartFailed)),
            ],
            vec![
                ca("gw-a", 1, Some(CloseReason::Pause)),
                ca("gw-b", 1, Some(CloseReason::Pause)),
                ca("gw-b", 2, None),
            ],
        )];
        let r = renewals(&pair(), &sessions);
        let a = of(&r, "gw-a");
        assert!(a.leases.is_empty());
        assert_eq!(a.forwarding.len(), 1);
        assert_eq!(a.forwarding[0].attempt, 2);
        assert_eq!(a.forwarding[0].holders, ["gw-b"]);
        assert_eq!(of(&r, "gw-b").leases, [("sbx-1".to_owned(), 2)]);
    }

    #[test]
    fn a_lapsed_lease_forwards_and_holders_come_sorted() {
        // Three members: gw-b's lease lapsed (its drop report destroyed the
        // CA), gw-c and gw-a hold on.
        let members: Vec<String> = vec!["gw-c".into(), "gw-a".into(), "gw-b".into()];
        let sessions = [(
            session("sbx-1", State::Running),
            vec![attempt(1, None)],
            vec![
                ca("gw-c", 1, None),
                ca("gw-b", 1, Some(CloseReason::LeaseExpired)),
                ca("gw-a", 1, None),
            ],
        )];
        let r = renewals(&members, &sessions);
        let ids: Vec<&str> = r.iter().map(|m| m.gateway.as_str()).collect();
        assert_eq!(ids, ["gw-a", "gw-b", "gw-c"]);
        assert_eq!(of(&r, "gw-b").forwarding[0].holders, ["gw-a", "gw-c"]);
        assert!(of(&r, "gw-a").forwarding.is_empty());
        assert!(of(&r, "gw-c").forwarding.is_empty());
    }

    #[test]
    fn a_session_not_running_gives_no_entry_and_no_lease() {
        for state in [
            State::Paused,
            State::Interrupted,
            State::Stopping,
            State::Ended,
        ] {
            let sessions = [(
                session("sbx-1", state),
                vec![attempt(1, None)],
                vec![
                    ca("gw-a", 1, Some(CloseReason::GatewayRestarted)),
                    ca("gw-b", 1, None),
                ],
            )];
            let r = renewals(&pair(), &sessions);
            assert_eq!(r.len(), 2, "{state}");
            for m in &r {
                assert!(m.leases.is_empty(), "{state}: {m:?}");
                assert!(m.forwarding.is_empty(), "{state}: {m:?}");
            }
        }
    }

    #[test]
    fn both_members_holding_gives_no_entry() {
        let sessions = [(
            session("sbx-1", State::Running),
            vec![attempt(1, None)],
            vec![ca("gw-a", 1, None), ca("gw-b", 1, None)],
        )];
        let r = renewals(&pair(), &sessions);
        for m in &r {
            assert_eq!(m.leases, [("sbx-1".to_owned(), 1)]);
            assert!(m.forwarding.is_empty(), "{m:?}");
        }
    }

    #[test]
    fn no_live_holder_anywhere_gives_no_entry() {
        // gw-a holds nothing, and gw-b's CA is destroyed too (or was made
        // for an earlier attempt only).
        let sessions = [
            (
                session("sbx-1", State::Running),
                vec![attempt(1, None)],
                vec![
                    ca("gw-a", 1, Some(CloseReason::GatewayRestarted)),
                    ca("gw-b", 1, Some(CloseReason::LeaseExpired)),
                ],
            ),
            (
                session("sbx-2", State::Running),
                vec![attempt(1, Some(AttemptEnd::Paused)), attempt(2, None)],
                vec![ca("gw-b", 1, None)],
            ),
        ];
        let r = renewals(&pair(), &sessions);
        assert_eq!(r.len(), 2);
        for m in &r {
            assert!(m.leases.is_empty(), "{m:?}");
            assert!(m.forwarding.is_empty(), "{m:?}");
        }
    }

    #[test]
    fn a_member_known_only_by_its_ca_is_told_too() {
        let sessions = [(
            session("sbx-1", State::Running),
            vec![attempt(1, None)],
            vec![ca("gw-x", 1, None)],
        )];
        let r = renewals(&pair(), &sessions);
        let ids: Vec<&str> = r.iter().map(|m| m.gateway.as_str()).collect();
        assert_eq!(ids, ["gw-a", "gw-b", "gw-x"]);
        assert_eq!(of(&r, "gw-x").leases, [("sbx-1".to_owned(), 1)]);
        assert_eq!(of(&r, "gw-a").forwarding[0].holders, ["gw-x"]);
    }
}
