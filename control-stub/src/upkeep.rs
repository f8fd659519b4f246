//! What `control-stub serve` does while nobody types a command: the
//! control plane's long-running part.
//!
//! Per member given, a loop of its own ([`Upkeep::keep_members`], every
//! `--renew-ms`, on a thread, a store connection and a control channel
//! client of that member's own, so that a member that hangs — each call to
//! it waits out a connect or call timeout — never delays the renewals of
//! another):
//!
//! 1. **Who the members are**: each gateway given is
//!    asked `Describe`; a new one is registered (first contact), and the
//!    process instance and lease each runs are recorded.
//! 2. **Leases**: one `RenewLeases` call per member,
//!    listing every (session, attempt) it holds live by the store (a
//!    running session's latest attempt, a CA of that member not yet
//!    destroyed). A renewal never brings back an authority the member
//!    closed, replaced or let lapse; the member says so (`not_held`), and
//!    its report in its batch chain settles it.
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
//!    for 7 days ends (`paused_too_long`); a running session in mode
//!    commands idle for its idle timeout (no start, resume, recovery or
//!    attach since) pauses or ends (`idle_timeout`), as its `idle_action`
//!    says.
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
//! `stub_lease_renewals_total{gateway,result}`, `stub_gateway_up{gateway}`
//! (here); `stub_batches_accepted_total{gateway}`,
//! `stub_batches_rejected_total{gateway,reason}`,
//! `stub_reports_accepted_total{gateway,kind}` (the batch consumer);
//! `stub_certificates_issued_total` (the certificate).

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use crate::error::Error;
use crate::lifecycle::{ask_closes, Lifecycle};
use crate::link::{GatewayLink, ReportVerifier};
use crate::machine::Event;
use crate::model::{limits, CloseAttempt, IdleAction, Renewal, State};
use crate::store::Store;

/// How often the loop looks, by default: closes owed are asked at most
/// this late, and time-driven events happen within it.
pub const DEFAULT_TICK: Duration = Duration::from_secs(1);

/// How often leases are renewed, by default: 10 s, a sixth of the
/// gateway's default lease (60 s), so five renewals in a row can fail (a
/// control plane restarting, a network blip) before any authority lapses.
pub const DEFAULT_RENEW: Duration = Duration::from_secs(10);

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
    /// Closes asked again, and those confirmed by this tick.
    pub closes_asked: usize,
    pub closes_confirmed: usize,
    /// Sessions a time-driven event changed: (session, what happened).
    pub events: Vec<(String, String)>,
    /// Certificates issued this tick.
    pub issued: Vec<String>,
}

/// The loop's state: its store connection and control channel client.
pub struct Upkeep<'a> {
    pub store: &'a mut Store,
    pub link: &'a dyn GatewayLink,
    pub verifier: &'a dyn ReportVerifier,
    /// The control plane's key, to sign certificates with; none: nothing is
    /// issued (the certificates wait).
    pub plane_key: Option<&'a talos_certs::GatewayKey>,
    /// The relay key opens carry (a session the idle timeout resumes never
    /// happens: only pauses and ends come from here, so it is unused today
    /// but kept with the lifecycle's settings).
    pub relay_public_key: Option<[u8; 32]>,
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
                            self.store
                                .write(|tx| tx.gateway_unreached(&d.gateway_id, &e.to_string()))?;
                            continue;
                        }
                    }
                    let at = crate::store::now();
                    self.store
                        .write(|tx| tx.gateway_seen(&d.gateway_id, &d.instance, d.lease_ms, &at))?;
                    report.members_up.push(d.gateway_id);
                }
                Err(e) => {
                    metrics::gauge!("stub_gateway_up", "gateway" => reply.member.clone()).set(0.0);
                    self.store
                        .write(|tx| tx.gateway_unreached(&reply.member, &e.to_string()))?;
                    report.members_down.push((reply.member, e.to_string()));
                }
            }
        }
        Ok(())
    }

    /// Renew, per member, the leases of what it holds live by the store.
    fn renew(&mut self, report: &mut TickReport) -> Result<(), Error> {
        let leases: BTreeMap<String, Vec<(String, u32)>> = self.store.read(|tx| {
            let mut by_member: BTreeMap<String, Vec<(String, u32)>> = BTreeMap::new();
            for g in tx.gateway_list()? {
                by_member.entry(g.id).or_default();
            }
            for session in tx.sessions_in(&[State::Running])? {
                let Some(latest) = tx
                    .attempts(&session.id)?
                    .into_iter()
                    .rev()
                    .find(|a| a.end_cause != Some(crate::model::AttemptEnd::StartFailed))
                else {
                    continue;
                };
                for ca in tx.cas(&session.id)? {
                    if ca.attempt == latest.n && ca.destroyed_at.is_none() {
                        by_member
                            .entry(ca.gateway_id)
                            .or_default()
                            .push((session.id.clone(), latest.n));
                    }
                }
            }
            Ok(by_member)
        })?;
        let leases: Vec<(String, Vec<(String, u32)>)> = leases.into_iter().collect();
        for reply in self.link.renew(&leases) {
            match reply.result {
                Ok(r) => {
                    metrics::counter!("stub_lease_renewals_total", "gateway" => reply.member.clone(), "result" => Renewal::Ok.as_str())
                        .increment(1);
                    report.renewed += r.renewed.len();
                    for (s, a) in r.not_held {
                        report.not_held.push((reply.member.clone(), s, a));
                    }
                    let at = crate::store::now();
                    self.store
                        .write(|tx| tx.gateway_seen(&reply.member, &r.instance, r.lease_ms, &at))?;
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

    /// The spec's time-driven events at `now`.
    fn time_events(&mut self, now: SystemTime, report: &mut TickReport) -> Result<(), Error> {
        let since = |stamp: Option<&str>| -> Option<Duration> {
            let t = humantime::parse_rfc3339(stamp?).ok()?;
            now.duration_since(t).ok()
        };
        let (opens, interrupted, paused, running) = self.store.read(|tx| {
            let mut interrupted = Vec::new();
            for s in tx.sessions_in(&[State::Interrupted])? {
                let at = tx.attempts(&s.id)?.last().and_then(|a| a.ended_at.clone());
                interrupted.push((s, at));
            }
            let mut paused = Vec::new();
            for s in tx.sessions_in(&[State::Paused])? {
                // The pause: the end of the last attempt that ran.
                let at = tx
                    .attempts(&s.id)?
                    .into_iter()
                    .rev()
                    .find(|a| a.end_cause == Some(crate::model::AttemptEnd::Paused))
                    .and_then(|a| a.ended_at);
                paused.push((s, at));
            }
            Ok((
                tx.opens_in_flight()?,
                interrupted,
                paused,
                tx.sessions_in(&[State::Running])?,
            ))
        })?;
        for (id, n, began) in opens {
            if since(Some(&began)).is_some_and(|d| d >= limits::OPEN_DEADLINE)
                && self.life().give_up_open(&id, n)?
            {
                report.events.push((
                    id,
                    format!("open_timed_out: attempt {n} had no answers within 60 s"),
                ));
            }
        }
        for (s, at) in interrupted {
            if since(at.as_deref()).is_some_and(|d| d >= limits::INTERRUPTION_WAIT)
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
            if since(at.as_deref()).is_some_and(|d| d >= limits::PAUSE_LIMIT)
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
        for s in running {
            let (Some(secs), Some(action)) = (s.idle_timeout_seconds, s.idle_action) else {
                continue;
            };
            let idle = since(s.last_activity_at.as_deref().or(Some(&s.created_at)));
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
        Lifecycle::new(self.store, self.link, self.verifier).with_relay_key(self.relay_public_key)
    }
}

/// One JSON line on standard error.
fn log(event: &str, gateway: &str, detail: &str) {
    eprintln!(
        "{}",
        serde_json::json!({"upkeep": event, "gateway": gateway, "detail": detail})
    );
}
