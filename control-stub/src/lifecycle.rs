//! Sessions driven through their states: every command, `serve`'s
//! time-driven events and the reset are decided by the state machine
//! ([`crate::machine::next`]: state × mode × event → the next state and
//! what the transition does, or the stable error), committed in one store
//! transaction, and only then — when the gateways are concerned — the
//! members are asked, all at once, and their answers recorded. No call to
//! a member is made inside a store transaction.
//!
//! # Opening: decide, commit, call, record
//!
//! **start** (attempt 1, cause `launch`), **resume** (`resume`) and
//! **recover** (`recovery`) open an authority on every member of the pair:
//!
//! 1. **Decide and commit**, in one transaction: a start's checks (the
//!    egress list, the secrets, the source addresses), the machine's
//!    decision, and the open in flight: the session `launching`,
//!    `resuming` or `recovering`, and the new attempt, not ended, with
//!    what it opens with. The attachments' values are read from the secret
//!    store in that transaction. A resume or recovery opens with the names
//!    the session asked for that are still on the egress list, and the
//!    attachments whose secret still exists and whose destination is still
//!    listed.
//! 2. **Call**: every member is asked at once, each within the link's
//!    deadline; the store is not held meanwhile. Each member makes a fresh
//!    CA.
//! 3. **Record**, in one transaction: each CA made (the control stub
//!    recomputes its SHA-384 digest from its PEM, and records it with the
//!    member process that made it); a close owed to each member that did
//!    not answer, or answered something that does not hold together (the
//!    open may have reached it unseen); and the machine's decision on the
//!    answers.
//!
//! A member that cannot be reached does not stop the session: it goes on
//! through the members that opened (its trust bundle holds their CAs), and
//! the close owed to the unreachable member settles once it says it holds
//! nothing. A member that *refuses*, or answers something that does not
//! hold together, fails the transition, and so does an open no member
//! made: the attempt ends `start_failed`, a close is owed to every member
//! that opened and asked at once (as an end's closes are), a resume
//! returns to `paused`, a recovery to `interrupted`, and a start ends the
//! session (`start_failed`, through the reset like any other end). The
//! command fails with the first refusal (`gateway_refused`,
//! `gateway_reply_invalid`) or, with no member opened,
//! `gateway_unreachable`.
//!
//! **Failing closed.** No authority is live on a member without a record
//! of it here. While the call is in flight its attempt is recorded, and no
//! lease is renewed for it (`serve` renews only the recorded CAs of a
//! running session), so whatever the open made lapses with its lease (60 s
//! by default) if nothing ends it sooner. A process that stops between the
//! commit and the record (killed, or its machine lost) leaves the session
//! `launching`, `resuming` or `recovering`: `serve` gives that open up
//! after [`limits::OPEN_DEADLINE`] (`open_timed_out`, which the machine
//! decides as a failed open) and owes a close of the attempt to every
//! registered member, so that each says in its signed word that it holds
//! nothing ([`crate::confirm`]). A stop or a Revoke All while an open is in
//! flight is committed at once; the open's attempt is then ended by its
//! answers or by `serve` giving it up, and the reset stays incomplete until
//! then. Answers that come after their session ended, or after `serve`
//! gave their open up, are recorded all the same, each CA they made is
//! owed a close, and the command fails (`sandbox_ended`, or
//! `gateway_unreachable`).
//!
//! # Closing: the control plane decides, the members follow
//!
//! **pause**, **interrupt**, **stop**, **revoke-all** and `serve`'s
//! time-driven events commit first, in one transaction: the new state
//! (`paused`, `interrupted`, or `stopping`), the attempt's end, every
//! pending approval withdrawn, and a close owed to every member whose CA
//! is not yet confirmed destroyed. Only then are the members asked, all at
//! once, each within the link's deadline; each answer is recorded as it is
//! ([`crate::confirm`]). A member that does not confirm leaves its close
//! owed: `control-stub serve` asks again, with growing delays, until the
//! member's signed word is in — a drop report in a reply or in its batch
//! chain, or its successor's start report — and the member's lease ends
//! the authority meanwhile if nobody renews it. So these commands work
//! whatever members are down, hung or restarted, and never leave authority
//! live anywhere once the lease has run.
//!
//! **stop**/**revoke-all** then run the reset: steps 1–3 are stub responses
//! (this control stub runs no instances); step 4 (`gateway_ca_destroyed`)
//! and step 5 (`secrets_detached`) are confirmed by the gateways' signed
//! words for every attempt. The session is `reset_incomplete` while a close
//! is owed, and `ended` once every step is confirmed; its certificate is
//! issued after that ([`crate::certificate`](mod@crate::certificate)).

use std::collections::BTreeSet;
use std::time::SystemTime;

use serde::Serialize;

use crate::confirm;
use crate::error::{Error, LinkError};
use crate::link::{
    Attachment, CloseSession, GatewayLink, OpenSession, Opened, Reply, ReportVerifier, NO_GATEWAY,
};
use crate::machine::{self, Event, Next, Refusal, Step};
use crate::model::{
    limits, AttemptEnd, CloseReason, EndReason, IdleAction, Mode, State, StopAfter,
};
use crate::names::{self, AttachSpec};
use crate::store::{
    now, Attempt, CaEvent, CloseTask, CommandRecord, DropReport, Requester, ResetStep, Session,
    Store, Tx,
};
use crate::trust::SessionTrust;

pub use crate::confirm::stub_response;

/// `sandbox start`, before any check.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StartRequest {
    pub tenant: String,
    /// Source addresses (`--source`), as given.
    pub sources: Vec<String>,
    /// Destination names (`--allow`), as given.
    pub allow: Vec<String>,
    /// Attachments (`--attach SECRET=destination:header[:scheme]`), as given.
    pub attach: Vec<String>,
    pub mode: Mode,
    /// `--idle-timeout-seconds` and `--idle-action`, as given.
    pub idle_timeout_seconds: Option<u32>,
    pub idle_action: Option<String>,
    /// `--stop-after`: the hard stop, in seconds of compute, as given
    /// (checked by [`StopAfter::new`]); none: no hard stop.
    pub stop_after_seconds: Option<u64>,
}

impl StartRequest {
    /// A request with no idle settings (each mode's default).
    pub fn new(
        tenant: &str,
        sources: Vec<String>,
        allow: Vec<String>,
        attach: Vec<String>,
        mode: Mode,
    ) -> StartRequest {
        StartRequest {
            tenant: tenant.to_owned(),
            sources,
            allow,
            attach,
            mode,
            idle_timeout_seconds: None,
            idle_action: None,
            stop_after_seconds: None,
        }
    }
}

/// What a transition did: printed by the CLI as JSON.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Transition {
    pub session_id: String,
    pub state: State,
    /// The session's latest attempt.
    pub attempt: u32,
    /// The CAs the gateways made, when the transition opened an authority.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub ca: Vec<CaView>,
    /// What the new attempt opened with.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub allowlist: Option<Vec<String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub attachments: Option<Vec<AttachSpec>>,
    /// What a resume or recovery left out, and why.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub left_out: Vec<LeftOut>,
    /// Members that could not be reached when the authority opened: the
    /// session goes on through the others.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub unreached: Vec<Unreached>,
    /// The drop reports the transition received, as checked.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub reports: Vec<DropReport>,
    /// Closes still owed after this transition: the members that did not
    /// confirm (asked again by `control-stub serve` until they do).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub closes_owed: Vec<CloseTask>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub end_reason: Option<EndReason>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub outcome: Option<String>,
    /// The reset, when the transition ended the session.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub reset: Vec<ResetStep>,
}

/// A CA as a transition shows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct CaView {
    pub gateway_id: String,
    pub digest: String,
}

/// A member an open could not reach.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Unreached {
    pub gateway: String,
    pub error: String,
}

/// A name or attachment the session asked for that a resume or recovery
/// did not open with.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct LeftOut {
    /// `destination` or `attachment`.
    pub kind: &'static str,
    /// The destination name, or the attachment's secret name.
    pub name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub destination: Option<String>,
    pub why: &'static str,
}

/// `sandbox status`: the session, its attempts with their CAs, the drop
/// reports, the closes owed and settled per member, and the reset.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Status {
    #[serde(flatten)]
    pub session: Session,
    pub attempts: Vec<AttemptStatus>,
    pub drop_reports: Vec<DropReport>,
    /// Every close asked of a member, with its state: owed (`confirmed_at`
    /// null, with the last error and the next ask) or confirmed.
    pub closes: Vec<CloseTask>,
    pub reset: Vec<ResetStep>,
    /// Every command and time-driven event that moved the session, with
    /// who asked.
    pub commands: Vec<CommandRecord>,
    /// The compute the session has used so far, in whole seconds: the
    /// running time of its attempts (each from its `running_at`), which
    /// its hard stop (`stop_after_seconds`) counts; a pause uses none.
    pub compute_seconds: u64,
    /// Whether the certificate is issued.
    pub certificate_issued: bool,
    /// Until it is, what it waits for ([`confirm::certificate_waits_for`]):
    /// the session's end, a close, a member's batches, a forwarder's
    /// hand-off records, a reset step.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub certificate_waits_for: Option<String>,
}

/// An attempt with the CAs made for it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct AttemptStatus {
    #[serde(flatten)]
    pub attempt: Attempt,
    pub ca: Vec<CaEvent>,
}

/// Drives sessions through their states, against a store and a gateway
/// pair.
pub struct Lifecycle<'a> {
    store: &'a mut Store,
    link: &'a dyn GatewayLink,
    verifier: &'a dyn ReportVerifier,
    relay_public_key: Option<[u8; 32]>,
    /// Who asks for the commands this lifecycle commits (time-driven
    /// events name their cause instead); unset, the operator running this
    /// process ([`local_operator`]).
    requester: Option<Requester>,
}

impl std::fmt::Debug for Lifecycle<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lifecycle")
            .field("store", &self.store.path())
            .field("verifier", &self.verifier.describe())
            .finish_non_exhaustive()
    }
}

impl<'a> Lifecycle<'a> {
    pub fn new(
        store: &'a mut Store,
        link: &'a dyn GatewayLink,
        verifier: &'a dyn ReportVerifier,
    ) -> Lifecycle<'a> {
        Lifecycle {
            store,
            link,
            verifier,
            relay_public_key: None,
            requester: None,
        }
    }

    /// Commit commands as asked by `requester` (by default, the operator
    /// running this process: [`local_operator`]).
    pub fn with_requester(mut self, requester: Requester) -> Lifecycle<'a> {
        self.requester = Some(requester);
        self
    }

    /// Who asks for an operator's command.
    fn requester(&self) -> Requester {
        self.requester
            .clone()
            .unwrap_or_else(|| Requester::operator(&local_operator()))
    }

    /// Open sessions with the approval relay's public key, so the gateways
    /// accept its decisions. Without one (the default) the gateways are
    /// told there is no relay, and refuse what the Lock holds at once.
    pub fn with_relay_key(mut self, key: Option<[u8; 32]>) -> Lifecycle<'a> {
        self.relay_public_key = key;
        self
    }

    /// `sandbox start`: check the request against the account policy and
    /// the tenant's secrets, commit the session with attempt 1 in flight,
    /// then open it on the members.
    pub fn start(&mut self, req: &StartRequest) -> Result<Transition, Error> {
        let tenant = names::tenant(&req.tenant).map_err(|e| Error::invalid(e.to_string()))?;
        let (sources, allow, attach) = names::scope(&req.sources, &req.allow, &req.attach)?;
        let (idle_timeout_seconds, idle_action) = idle_settings(req)?;
        let stop_after = req
            .stop_after_seconds
            .map(StopAfter::new)
            .transpose()
            .map_err(Error::invalid)?;
        let relay = self.relay_public_key;
        let by = &self.requester();
        let opening = self.store.write(|tx| {
            check_start(tx, &tenant, &sources, &allow, &attach)?;
            let next = machine::next(None, req.mode, Event::Start)
                .map_err(|r| r.error("(new session)", None))?;
            let at = now();
            let session = Session {
                id: tx.new_session_id()?,
                tenant: tenant.clone(),
                mode: req.mode,
                state: next.state(),
                created_at: at.clone(),
                ended_at: None,
                end_reason: None,
                outcome: None,
                allow: allow.clone(),
                attach: attach.clone(),
                sources: sources.clone(),
                idle_timeout_seconds,
                idle_action,
                last_activity_at: Some(at),
                stop_after_seconds: stop_after.map(StopAfter::seconds),
            };
            tx.insert_session(&session, &next)?;
            tx.record_command(
                &session.id,
                Event::Start.as_str(),
                by,
                Some(1),
                &session.created_at,
            )?;
            open_attempt(tx, &session, 1, &next, &allow, &attach, relay)
        })?;
        self.ask_open(opening, Vec::new())
    }

    /// `sandbox pause`: a running session in mode commands drops its
    /// authority and waits, paused.
    pub fn pause(&mut self, id: &str) -> Result<Transition, Error> {
        self.close(id, Event::Pause)?
    }

    /// `sandbox resume`: a paused session opens a new attempt from the
    /// current policy and secrets.
    pub fn resume(&mut self, id: &str) -> Result<Transition, Error> {
        self.reopen(id, Event::Resume)
    }

    /// `sandbox recover`: an interrupted session (mode commands) opens a new
    /// attempt, as a resume does.
    pub fn recover(&mut self, id: &str) -> Result<Transition, Error> {
        self.reopen(id, Event::Recover)
    }

    fn reopen(&mut self, id: &str, event: Event) -> Result<Transition, Error> {
        let by = self.requester();
        self.reopen_as(id, event, &by)
    }

    /// [`reopen`](Lifecycle::reopen), asked by `by`.
    fn reopen_as(&mut self, id: &str, event: Event, by: &Requester) -> Result<Transition, Error> {
        let relay = self.relay_public_key;
        let (opening, left_out) = self.store.write(|tx| {
            let (session, next) = decide(tx, id, event)??;
            let allowed = still_allowed(tx, &session)?;
            // Numbered after every attempt, a failed start's too.
            let n = tx.attempts(id)?.last().map_or(0, |a| a.n) + 1;
            let at = now();
            commit(tx, &session, n, &next, &at)?;
            tx.record_command(id, event.as_str(), by, Some(n), &at)?;
            let opening = open_attempt(
                tx,
                &session,
                n,
                &next,
                &allowed.allowlist,
                &allowed.attach,
                relay,
            )?;
            Ok((opening, allowed.left_out))
        })?;
        self.ask_open(opening, left_out)
    }

    /// Ask every member to open the attempt committed in flight, then
    /// record their answers and what the machine decides from them. A
    /// failed open's closes are asked at once, and its reset run when it
    /// ended the session.
    fn ask_open(
        &mut self,
        opening: OpenSession,
        left_out: Vec<LeftOut>,
    ) -> Result<Transition, Error> {
        let (id, n) = (opening.session_id.clone(), opening.attempt);
        let allowlist = opening.allowlist.clone();
        let attachments: Vec<AttachSpec> =
            opening.attachments.iter().map(Attachment::spec).collect();
        let replies = self.link.open(&opening);
        // The values, zeroed.
        drop(opening);
        let answered = self.store.write(|tx| record_open(tx, &id, n, &replies))?;
        if let Err(e) = answered.result {
            self.ask_owed(&id)?;
            self.store.write(|tx| confirm::reevaluate(tx, &id))?;
            return Err(e);
        }
        Ok(Transition {
            ca: answered.ca,
            unreached: answered.unreached,
            allowlist: Some(allowlist),
            attachments: Some(attachments),
            left_out,
            ..Transition::new(&id, answered.state, n)
        })
    }

    /// `sandbox interrupt`: the instance was lost without a pause. The
    /// gateways drop the authority; a session in mode commands waits,
    /// interrupted, and a session in mode agent ends with the outcome
    /// `outcome_unknown` (`interruption_lost`).
    pub fn interrupt(&mut self, id: &str) -> Result<Transition, Error> {
        self.close(id, Event::Interrupt)?
    }

    /// `sandbox stop`: a cancellation, from any state before the end.
    pub fn stop(&mut self, id: &str) -> Result<Transition, Error> {
        self.close(id, Event::Stop)?
    }

    /// `sandbox revoke-all`: a cancellation as Revoke All.
    pub fn revoke_all(&mut self, id: &str) -> Result<Transition, Error> {
        self.close(id, Event::RevokeAll)?
    }

    /// One of `serve`'s time-driven events (`idle_timeout_pause`,
    /// `idle_timeout_end`, `interruption_lost`, `paused_too_long`,
    /// `stop_after`), found due by the clock `serve` reads: committed as a
    /// command is, or `None` when the machine refuses it now (the session
    /// moved on since).
    pub fn time_event(&mut self, id: &str, event: Event) -> Result<Option<Transition>, Error> {
        let by = Requester::time(event.as_str());
        Ok(self.close_as(id, event, &by)?.ok())
    }

    /// `serve`: every authority of the running attempt of session `id` is
    /// gone (each member's CA destroyed, by a lapsed lease or the end of
    /// the process that held it, as their signed reports say), so nothing
    /// serves it. It is interrupted, `cause` recorded as who asked; a
    /// session in mode commands then recovers at once, as a new attempt
    /// (its instance runs: only its authorities were lost). If the members
    /// cannot open it now (the failed open is recorded as any failed
    /// recovery's), it stays interrupted and is not tried again, so that
    /// members out of reach do not make an attempt a tick: a `recover`
    /// or the 30 minutes' rule decides. A session in mode agent ends
    /// `interruption_lost`, as an interruption ends it. `None` when the
    /// session moved on meanwhile.
    pub fn authority_lost(&mut self, id: &str, cause: &str) -> Result<Option<Transition>, Error> {
        let by = Requester::time(cause);
        let interrupted = match self.close_as(id, Event::Interrupt, &by)? {
            Ok(t) => t,
            Err(_) => return Ok(None),
        };
        if interrupted.state != State::Interrupted {
            return Ok(Some(interrupted));
        }
        match self.reopen_as(id, Event::Recover, &by) {
            Ok(t) => Ok(Some(t)),
            Err(Error::Store(e)) => Err(Error::Store(e)),
            Err(_) => Ok(Some(interrupted)),
        }
    }

    /// `serve`: give up the open of attempt `n` of session `id`, found in
    /// flight for longer than [`limits::OPEN_DEADLINE`] (the process that
    /// committed it stopped before it recorded the answers). The machine
    /// decides it as a failed open (`open_timed_out`); a close of the
    /// attempt is owed to every registered member, since none said whether
    /// the open reached it, and asked at once. Returns whether the open was
    /// still in flight.
    pub fn give_up_open(&mut self, id: &str, n: u32) -> Result<bool, Error> {
        let given_up = self.store.write(|tx| {
            let session = load(tx, id)?;
            if !in_flight(tx, id, n)? {
                return Ok(false);
            }
            let at = now();
            let members: Vec<String> = tx.gateway_list()?.into_iter().map(|g| g.id).collect();
            match machine::next(Some(session.state), session.mode, Event::OpenTimedOut) {
                Ok(next) => {
                    for m in &members {
                        tx.insert_close_task(id, n, m, CloseReason::End, &at)?;
                    }
                    commit(tx, &session, n, &next, &at)?;
                    let event = Event::OpenTimedOut.as_str();
                    tx.record_command(id, event, &Requester::time(event), Some(n), &at)?;
                }
                // It ended while its open was in flight.
                Err(Refusal::Ended) => {
                    settle_late(tx, &session, n, AttemptEnd::StartFailed, &members, &at)?
                }
                // Its answers came meanwhile.
                Err(_) => return Ok(false),
            }
            Ok(true)
        })?;
        if given_up {
            self.ask_owed(id)?;
            self.store.write(|tx| confirm::reevaluate(tx, id))?;
        }
        Ok(given_up)
    }

    /// Decide `event` (an end, a pause, an interruption) for session `id`
    /// and commit it, then ask the members the closes it owes and, when it
    /// ended the session, run the reset. The inner error is the machine's
    /// refusal; the outer one, the store's or the link's failure.
    fn close(&mut self, id: &str, event: Event) -> Result<Result<Transition, Error>, Error> {
        let by = self.requester();
        self.close_as(id, event, &by)
    }

    /// [`close`](Lifecycle::close), asked by `by`.
    fn close_as(
        &mut self,
        id: &str,
        event: Event,
        by: &Requester,
    ) -> Result<Result<Transition, Error>, Error> {
        let decided = self.store.write(|tx| {
            let (session, next) = match decide(tx, id, event)? {
                Ok(decided) => decided,
                Err(refused) => return Ok(Err(refused)),
            };
            let n = tx.attempts(id)?.last().map_or(0, |a| a.n);
            let at = now();
            commit(tx, &session, n, &next, &at)?;
            let attempt = (n > 0).then_some(n);
            tx.record_command(id, event.as_str(), by, attempt, &at)?;
            Ok(Ok(next))
        })?;
        let next = match decided {
            Ok(next) => next,
            Err(refused) => return Ok(Err(refused)),
        };
        let reports = self.ask_owed(id)?;
        let mut t = if next.state().is_over() {
            self.finish_end(id)?
        } else {
            let attempt = self.store.read(|tx| latest_attempt(tx, id))?.n;
            Transition {
                closes_owed: self.owed(id)?,
                ..Transition::new(id, next.state(), attempt)
            }
        };
        t.reports = reports;
        Ok(Ok(t))
    }

    /// The reset, run once the members have been asked: the transition a
    /// stop, a Revoke All or an agent's interruption shows.
    fn finish_end(&mut self, id: &str) -> Result<Transition, Error> {
        let (session, state, attempt, reset) = self.store.write(|tx| {
            let session = load(tx, id)?;
            let (state, reset) = confirm::reset(tx, &session)?;
            Ok((session, state, latest_attempt(tx, id)?.n, reset))
        })?;
        Ok(Transition {
            end_reason: session.end_reason,
            outcome: session.outcome,
            reset,
            closes_owed: self.owed(id)?,
            ..Transition::new(id, state, attempt)
        })
    }

    /// Ask every member the session owes a close, all at once (one call
    /// per attempt), and record each answer. Returns the reports received.
    fn ask_owed(&mut self, id: &str) -> Result<Vec<DropReport>, Error> {
        let owed: Vec<CloseTask> = self.owed(id)?;
        ask_closes(
            self.store,
            self.link,
            self.verifier,
            id,
            &owed,
            SystemTime::now(),
        )
    }

    fn owed(&self, id: &str) -> Result<Vec<CloseTask>, Error> {
        self.store.read(|tx| {
            Ok(tx
                .close_tasks(id)?
                .into_iter()
                .filter(|t| t.confirmed_at.is_none())
                .collect())
        })
    }

    /// `sandbox attach`: a client attached; idle time counts from now
    /// (nothing changes for a session that is over).
    pub fn attach(&mut self, id: &str) -> Result<Status, Error> {
        self.store.write(|tx| {
            let (session, next) = decide(tx, id, Event::Attach)??;
            commit(tx, &session, 0, &next, &now())
        })?;
        status(self.store, id)
    }

    /// `sandbox status`.
    pub fn status(&self, id: &str) -> Result<Status, Error> {
        status(self.store, id)
    }

    /// `sandbox trust`: what a running session trusts: the CAs of its
    /// current attempt that are live (not reported destroyed, and not made
    /// by a gateway process that has since restarted: its start report
    /// says so), and the names that attempt opened as passthrough
    /// ([`SessionTrust::bundle`] makes the PEM bundle).
    pub fn trust(&self, id: &str) -> Result<SessionTrust, Error> {
        self.store.read(|tx| decide(tx, id, Event::Trust))??;
        let status = status(self.store, id)?;
        let mut trust = SessionTrust {
            cas: Vec::new(),
            passthrough: Vec::new(),
        };
        if let Some(current) = status
            .attempts
            .iter()
            .rev()
            .find(|a| a.attempt.end_cause != Some(AttemptEnd::StartFailed))
        {
            trust.cas = current
                .ca
                .iter()
                .filter(|c| c.destroyed_at.is_none())
                .map(|c| c.cert_pem.clone())
                .collect();
            trust.passthrough.clone_from(&current.attempt.passthrough);
        }
        Ok(trust)
    }
}

/// The machine's decision on `event` for session `id` as stored now: the
/// session and the transition, or (inside) the command's error.
fn decide(tx: &Tx<'_>, id: &str, event: Event) -> Result<Result<(Session, Next), Error>, Error> {
    let session = tx.session(id)?;
    let state = session.as_ref().map(|s| s.state);
    // With no session the machine reads no mode.
    let mode = session.as_ref().map_or(Mode::Agent, |s| s.mode);
    Ok(match (machine::next(state, mode, event), session) {
        (Ok(next), Some(session)) => Ok((session, next)),
        (Err(refusal), _) => Err(refusal.error(id, state)),
        // Only a start applies to no session, and a start is not decided
        // here.
        (Ok(_), None) => Err(Refusal::NotFound.error(id, None)),
    })
}

/// Do what `next` decides for `session` (`n`: the attempt it concerns) at
/// `at`: end the attempt, withdraw the pending approvals and owe the
/// closes its step says, then write the state. The one place a decided
/// transition of a session that exists is committed.
fn commit(tx: &Tx<'_>, session: &Session, n: u32, next: &Next, at: &str) -> Result<(), Error> {
    let id = &session.id;
    match next.step() {
        Step::Nothing => return Ok(()),
        Step::Touch | Step::Open(_) | Step::Reset => {}
        Step::Run => tx.run_attempt(id, n, at)?,
        Step::Drop { end, close } => {
            tx.end_attempt(id, n, end, at)?;
            tx.withdraw_proposals(id, at)?;
            owe_closes(tx, id, Some(n), close)?;
        }
        Step::End { attempt, close, .. } => {
            if let Some(end) = attempt {
                tx.end_attempt(id, n, end, at)?;
            }
            tx.withdraw_proposals(id, at)?;
            owe_closes(tx, id, None, close)?;
        }
    }
    tx.apply(id, next, at)
}

/// A start's checks against the store, before any gateway is asked: every
/// name on the egress list, every secret there, no source of a session
/// that has not ended.
fn check_start(
    tx: &Tx<'_>,
    tenant: &str,
    sources: &[std::net::IpAddr],
    allow: &[String],
    attach: &[AttachSpec],
) -> Result<(), Error> {
    let egress: BTreeSet<String> = tx.egress_names()?.into_iter().collect();
    if let Some(name) = allow.iter().find(|n| !egress.contains(*n)) {
        return Err(Error::DestinationNotAllowed { name: name.clone() });
    }
    for spec in attach {
        if !tx.secret_exists(tenant, &spec.secret)? {
            return Err(Error::SecretNotFound {
                tenant: tenant.to_owned(),
                name: spec.secret.clone(),
            });
        }
    }
    if let Some((addr, session_id)) = tx.live_session_with_source(sources)? {
        return Err(Error::SourceInUse {
            source_addr: addr.to_string(),
            session_id,
        });
    }
    Ok(())
}

/// What a resume or recovery opens with.
struct StillAllowed {
    /// The names the session asked for still on the egress list.
    allowlist: Vec<String>,
    /// The attachments whose secret still exists and whose destination is
    /// still listed.
    attach: Vec<AttachSpec>,
    left_out: Vec<LeftOut>,
}

/// What a resume or recovery of `session` opens with, now.
fn still_allowed(tx: &Tx<'_>, session: &Session) -> Result<StillAllowed, Error> {
    let egress: BTreeSet<String> = tx.egress_names()?.into_iter().collect();
    let mut left_out = Vec::new();
    let mut allowlist = Vec::new();
    for name in &session.allow {
        if egress.contains(name) {
            allowlist.push(name.clone());
        } else {
            left_out.push(LeftOut {
                kind: "destination",
                name: name.clone(),
                destination: None,
                why: "no longer on the egress list",
            });
        }
    }
    let mut attach = Vec::new();
    for spec in &session.attach {
        let why = if !allowlist.contains(&spec.destination) {
            Some("its destination is no longer on the egress list")
        } else if !tx.secret_exists(&session.tenant, &spec.secret)? {
            Some("the secret was deleted")
        } else {
            None
        };
        match why {
            None => attach.push(spec.clone()),
            Some(why) => left_out.push(LeftOut {
                kind: "attachment",
                name: spec.secret.clone(),
                destination: Some(spec.destination.clone()),
                why,
            }),
        }
    }
    Ok(StillAllowed {
        allowlist,
        attach,
        left_out,
    })
}

/// Record attempt `n` of `session` in flight, as `next` (an open) decided,
/// and make the request the members are asked: the attachments with their
/// values read now, and the Lock's rules as they stand now (the gateway
/// counts first_use afresh under this authority).
fn open_attempt(
    tx: &Tx<'_>,
    session: &Session,
    n: u32,
    next: &Next,
    allowlist: &[String],
    attach: &[AttachSpec],
    relay_public_key: Option<[u8; 32]>,
) -> Result<OpenSession, Error> {
    let Step::Open(cause) = next.step() else {
        return Err(Error::Store(format!(
            "session {}: {:?} records no attempt",
            session.id,
            next.step()
        )));
    };
    let lock = tx.lock_rules()?;
    let passthrough = passthrough_of(tx, allowlist, attach, &lock)?;
    let people = crate::people::open::people(tx)?;
    tx.insert_attempt(
        &session.id,
        &Attempt {
            n,
            cause,
            started_at: now(),
            ended_at: None,
            end_cause: None,
            allowlist: allowlist.to_vec(),
            attachments: attach.to_vec(),
            lock: lock.clone(),
            relay_public_key: relay_public_key.map(hex::encode),
            passthrough: passthrough.clone(),
            running_at: None,
            lab_approvals: people.lab_approvals,
        },
    )?;
    let mut attachments = Vec::new();
    for spec in attach {
        let value = tx
            .secret_value(&session.tenant, &spec.secret)?
            .ok_or_else(|| Error::SecretNotFound {
                tenant: session.tenant.clone(),
                name: spec.secret.clone(),
            })?;
        attachments.push(Attachment {
            secret: spec.secret.clone(),
            destination: spec.destination.clone(),
            header: spec.header.clone(),
            scheme: spec.scheme.clone(),
            value,
        });
    }
    Ok(OpenSession {
        session_id: session.id.clone(),
        attempt: n,
        tenant: session.tenant.clone(),
        sources: session.sources.clone(),
        allowlist: allowlist.to_vec(),
        attachments,
        cause,
        lock,
        relay_public_key,
        passthrough,
        people,
    })
}

/// The names of `allowlist` the account marks passthrough, for an open;
/// refused, naming the destination, when an attachment or a Lock rule
/// names one of them (the gateway, never seeing their requests, could
/// honour neither). A rule for any destination (`*`) reaches only the
/// terminated ones.
fn passthrough_of(
    tx: &Tx<'_>,
    allowlist: &[String],
    attach: &[AttachSpec],
    lock: &[crate::lock::LockRule],
) -> Result<Vec<String>, Error> {
    let marked: BTreeSet<String> = tx.passthrough_names()?.into_iter().collect();
    let passthrough: Vec<String> = allowlist
        .iter()
        .filter(|n| marked.contains(*n))
        .cloned()
        .collect();
    if let Some(a) = attach.iter().find(|a| passthrough.contains(&a.destination)) {
        return Err(Error::PassthroughConflict {
            destination: a.destination.clone(),
            what: format!(
                "is passthrough: the gateway passes its connections on without seeing a request, so it cannot carry attachment {} (the credential could never be injected)",
                a.secret
            ),
        });
    }
    if let Some(r) = lock.iter().find(|r| passthrough.contains(&r.destination)) {
        return Err(Error::PassthroughConflict {
            destination: r.destination.clone(),
            what: format!(
                "is passthrough: the gateway passes its connections on without seeing a request, so Lock rule {} that names it could never hold one; remove the rule or the passthrough mark",
                r.id
            ),
        });
    }
    Ok(passthrough)
}

/// Whether attempt `n` of session `id` is recorded and not ended.
fn in_flight(tx: &Tx<'_>, id: &str, n: u32) -> Result<bool, Error> {
    Ok(tx
        .attempts(id)?
        .iter()
        .any(|a| a.n == n && a.ended_at.is_none()))
}

/// What the answers to an open came to.
struct Answered {
    state: State,
    ca: Vec<CaView>,
    unreached: Vec<Unreached>,
    /// `Err`: the command's error (the open failed, or its answers came
    /// when its session had moved on).
    result: Result<(), Error>,
}

/// Record the members' answers to the open of attempt `n` of session `id`
/// (see the module docs): the CAs made, the closes owed to the members
/// that did not answer or answered something that does not hold together,
/// and the machine's decision on the answers, committed.
fn record_open(
    tx: &Tx<'_>,
    id: &str,
    n: u32,
    replies: &[Reply<Opened>],
) -> Result<Answered, Error> {
    let at = now();
    let read = read_replies(replies);
    for made in &read.made {
        tx.insert_ca(
            id,
            &CaEvent {
                attempt: n,
                gateway_id: made.opened.gateway_id.clone(),
                digest: made.digest.clone(),
                cert_pem: made.opened.ca_cert_pem.clone(),
                made_at: at.clone(),
                instance: Some(made.opened.instance.clone()).filter(|i| !i.is_empty()),
                destroyed_at: None,
                destroy_reason: None,
                destroy_report: None,
            },
        )?;
        if !made.opened.instance.is_empty() {
            let o = &made.opened;
            tx.gateway_seen(&o.gateway_id, &o.instance, o.lease_ms, &at)?;
        }
    }
    // A member that did not answer, or answered something that does not
    // hold together, may have opened it all the same: owe it a close, and
    // its lease ends it meanwhile. Named as the link names it (its id, or
    // its address as given); a link given no gateway has no member.
    let unsure = read
        .unreached
        .iter()
        .map(|u| &u.gateway)
        .chain(&read.garbled);
    for member in unsure.filter(|m| names::gateway_id(m).is_ok() && *m != NO_GATEWAY) {
        tx.insert_close_task(id, n, member, CloseReason::End, &at)?;
    }
    let session = load(tx, id)?;
    let event = match read.failure {
        None => Event::Opened,
        Some(_) => Event::OpenFailed,
    };
    let still = in_flight(tx, id, n)?;
    let decided = machine::next(Some(session.state), session.mode, event).and_then(|next| {
        // An open `serve` gave up is not in flight, whatever the session's
        // state says now (a newer open, say).
        if still {
            Ok(next)
        } else {
            Err(Refusal::NotOpening)
        }
    });
    let ca: Vec<CaView> = read
        .made
        .iter()
        .map(|m| CaView {
            gateway_id: m.opened.gateway_id.clone(),
            digest: m.digest.clone(),
        })
        .collect();
    let (state, result) = match decided {
        Ok(next) => {
            commit(tx, &session, n, &next, &at)?;
            (next.state(), read.failure.map_or(Ok(()), Err))
        }
        Err(refusal) => {
            let made: Vec<String> = ca.iter().map(|c| c.gateway_id.clone()).collect();
            settle_late(tx, &session, n, AttemptEnd::SessionEnded, &made, &at)?;
            (session.state, Err(refusal.error(id, Some(session.state))))
        }
    };
    Ok(Answered {
        state,
        ca,
        unreached: read.unreached,
        result,
    })
}

/// An open's answers, or its deadline, that found its session no longer
/// opening (it ended meanwhile, or `serve` gave the open up): the attempt
/// ends (`end`) if it has not, a close is owed to every member in
/// `members` (again, if one of that attempt was settled before its CA was
/// recorded), and the reset of a session that is over runs again.
fn settle_late(
    tx: &Tx<'_>,
    session: &Session,
    n: u32,
    end: AttemptEnd,
    members: &[String],
    at: &str,
) -> Result<(), Error> {
    if in_flight(tx, &session.id, n)? {
        tx.end_attempt(&session.id, n, end, at)?;
    }
    let close = match session.end_reason {
        Some(EndReason::RevokeAll) => CloseReason::RevokeAll,
        _ => CloseReason::End,
    };
    for member in members {
        tx.owe_close_again(&session.id, n, member, close, at)?;
    }
    confirm::reevaluate(tx, &session.id)
}

/// A CA a member made, its answer checked.
struct Made {
    opened: Opened,
    /// SHA-384 of the certificate, recomputed from its PEM.
    digest: String,
}

/// The members' answers to an open, read.
struct Replies {
    made: Vec<Made>,
    unreached: Vec<Unreached>,
    /// Members whose answer did not hold together (or did not parse): they
    /// may hold the authority.
    garbled: Vec<String>,
    /// Why the open failed, if it did: the first refusal or answer that
    /// does not hold together, in the members' order; with none, no member
    /// opened (the first unreachable member's error).
    failure: Option<Error>,
}

/// Check each member's answer to an open: a CA whose stated digest is the
/// certificate's, from a well-formed gateway id that answers once.
fn read_replies(replies: &[Reply<Opened>]) -> Replies {
    let mut out = Replies {
        made: Vec::new(),
        unreached: Vec::new(),
        garbled: Vec::new(),
        failure: None,
    };
    let mut first_unreachable = None;
    for r in replies {
        let o = match &r.result {
            Ok(o) => o,
            Err(e @ LinkError::Unreachable(_)) => {
                out.unreached.push(Unreached {
                    gateway: r.member.clone(),
                    error: e.to_string(),
                });
                first_unreachable.get_or_insert_with(|| e.clone());
                continue;
            }
            Err(e) => {
                if matches!(e, LinkError::Invalid { .. }) {
                    out.garbled.push(r.member.clone());
                }
                out.failure.get_or_insert_with(|| Error::Link(e.clone()));
                continue;
            }
        };
        match check_opened(o, &out.made) {
            Ok(digest) => out.made.push(Made {
                opened: o.clone(),
                digest,
            }),
            Err(e) => {
                out.garbled.push(r.member.clone());
                out.failure.get_or_insert(e);
            }
        }
    }
    if out.failure.is_none() && out.made.is_empty() {
        out.failure = Some(match first_unreachable {
            Some(e) => Error::Link(e),
            None => Error::GatewayReplyInvalid {
                gateway_id: "(none)".into(),
                reason: "no gateway opened the session".into(),
            },
        });
    }
    out
}

/// The digest of the CA in `o`, if the answer holds together (`made`: the
/// answers read before it).
fn check_opened(o: &Opened, made: &[Made]) -> Result<String, Error> {
    let bad = |reason: String| Error::GatewayReplyInvalid {
        gateway_id: o
            .gateway_id
            .chars()
            .take(names::MAX_GATEWAY_ID_LEN)
            .collect(),
        reason,
    };
    names::gateway_id(&o.gateway_id).map_err(|e| bad(e.to_string()))?;
    if made.iter().any(|m| m.opened.gateway_id == o.gateway_id) {
        return Err(bad("the gateway answered twice".into()));
    }
    let digest = pem_digest(&o.ca_cert_pem).map_err(bad)?;
    if !digest.eq_ignore_ascii_case(&o.ca_digest) {
        return Err(bad(format!(
            "the stated CA digest {} is not the certificate's ({digest})",
            o.ca_digest
        )));
    }
    Ok(digest)
}

/// Check the idle settings of a start request (spec: "Idle timeout"). In
/// mode agent any idle setting is refused: `idle_action pause` with
/// `sandbox_pause_unavailable`, anything else `sandbox_request_invalid`. In
/// mode commands the timeout is 60–86,400 seconds (default 900) and the
/// action `end` (default) or `pause`.
fn idle_settings(req: &StartRequest) -> Result<(Option<u32>, Option<IdleAction>), Error> {
    match req.mode {
        Mode::Agent => {
            if req.idle_action.as_deref() == Some("pause") {
                return Err(Error::PauseUnavailable {
                    id: "(new session in mode agent)".into(),
                });
            }
            if req.idle_timeout_seconds.is_some() || req.idle_action.is_some() {
                return Err(Error::invalid(
                    "a session in mode agent runs its agent for as long as it exists and takes no idle_timeout_seconds or idle_action",
                ));
            }
            Ok((None, None))
        }
        Mode::Commands => {
            let secs = req
                .idle_timeout_seconds
                .unwrap_or(limits::IDLE_DEFAULT_SECS);
            if !(limits::IDLE_MIN_SECS..=limits::IDLE_MAX_SECS).contains(&secs) {
                return Err(Error::invalid(format!(
                    "idle_timeout_seconds {secs} is outside {}-{}",
                    limits::IDLE_MIN_SECS,
                    limits::IDLE_MAX_SECS
                )));
            }
            let action = match req.idle_action.as_deref() {
                None => IdleAction::End,
                Some(text) => IdleAction::parse(text).ok_or_else(|| {
                    Error::invalid(format!(
                        "idle_action {:?} is neither end nor pause",
                        text.chars().take(40).collect::<String>()
                    ))
                })?,
            };
            Ok((Some(secs), Some(action)))
        }
    }
}

/// Owe a close to every member whose CA of `attempt` (of every attempt when
/// `None`) is not yet confirmed destroyed.
fn owe_closes(
    tx: &Tx<'_>,
    session_id: &str,
    attempt: Option<u32>,
    reason: CloseReason,
) -> Result<(), Error> {
    let at = now();
    for ca in tx.cas(session_id)? {
        if ca.destroyed_at.is_none() && attempt.is_none_or(|a| a == ca.attempt) {
            tx.insert_close_task(session_id, ca.attempt, &ca.gateway_id, reason, &at)?;
        }
    }
    Ok(())
}

/// Ask the members the closes `owed` (of session `id`) at once, one call
/// per attempt, and record each answer in its own transaction (`clock`
/// dates the next ask of a close that failed). Returns the reports
/// received. Used by the transitions and by `serve`'s retries.
pub fn ask_closes(
    store: &mut Store,
    link: &dyn GatewayLink,
    verifier: &dyn ReportVerifier,
    id: &str,
    owed: &[CloseTask],
    clock: SystemTime,
) -> Result<Vec<DropReport>, Error> {
    let mut attempts: Vec<u32> = owed.iter().map(|t| t.attempt).collect();
    attempts.sort_unstable();
    attempts.dedup();
    let mut reports = Vec::new();
    for attempt in attempts {
        let tasks: Vec<&CloseTask> = owed.iter().filter(|t| t.attempt == attempt).collect();
        let members: Vec<String> = tasks.iter().map(|t| t.gateway_id.clone()).collect();
        let reason = tasks[0].reason;
        let answers = link.close(
            &CloseSession {
                session_id: id.to_owned(),
                attempt,
                reason,
            },
            Some(&members),
        );
        store.write(|tx| {
            for task in &tasks {
                let answer = answers
                    .iter()
                    .find(|a| a.member == task.gateway_id)
                    .map(|a| a.result.clone())
                    .unwrap_or_else(|| {
                        Err(LinkError::Unreachable(format!(
                            "{}: not among the gateways given (--gateway {}=ADDR)",
                            task.gateway_id, task.gateway_id
                        )))
                    });
                let report = confirm::close_answered(
                    tx,
                    verifier,
                    id,
                    attempt,
                    &task.gateway_id,
                    task.reason,
                    &answer,
                    clock,
                )?;
                reports.extend(report);
            }
            confirm::reevaluate(tx, id)
        })?;
    }
    Ok(reports)
}

/// `sandbox status`, read from the store alone.
pub fn status(store: &Store, id: &str) -> Result<Status, Error> {
    store.read(|tx| {
        let session = load(tx, id)?;
        let cas = tx.cas(id)?;
        let attempts = tx.attempts(id)?;
        let compute_seconds = crate::machine::compute_used(
            attempts.iter().filter_map(Attempt::running_span),
            SystemTime::now(),
        )
        .as_secs();
        let attempts = attempts
            .into_iter()
            .map(|attempt| AttemptStatus {
                ca: cas
                    .iter()
                    .filter(|c| c.attempt == attempt.n)
                    .cloned()
                    .collect(),
                attempt,
            })
            .collect();
        let certificate_issued = tx.issued_certificate(id)?.is_some();
        let certificate_waits_for = if certificate_issued {
            None
        } else {
            confirm::certificate_waits_for(tx, &session)?
        };
        Ok(Status {
            session,
            attempts,
            drop_reports: tx.drop_reports(id)?,
            closes: tx.close_tasks(id)?,
            reset: tx.reset_steps(id)?,
            commands: tx.commands(id)?,
            compute_seconds,
            certificate_issued,
            certificate_waits_for,
        })
    })
}

impl Transition {
    fn new(id: &str, state: State, attempt: u32) -> Transition {
        Transition {
            session_id: id.to_owned(),
            state,
            attempt,
            ca: Vec::new(),
            allowlist: None,
            attachments: None,
            left_out: Vec::new(),
            unreached: Vec::new(),
            reports: Vec::new(),
            closes_owed: Vec::new(),
            end_reason: None,
            outcome: None,
            reset: Vec::new(),
        }
    }
}

pub(crate) fn load(tx: &Tx<'_>, id: &str) -> Result<Session, Error> {
    tx.session(id)?.ok_or_else(|| Error::SandboxNotFound {
        id: id.chars().take(100).collect(),
    })
}

/// The session's latest attempt that opened, or its first (a start that
/// failed).
fn latest_attempt(tx: &Tx<'_>, id: &str) -> Result<Attempt, Error> {
    let attempts = tx.attempts(id)?;
    attempts
        .iter()
        .rev()
        .find(|a| a.end_cause != Some(AttemptEnd::StartFailed))
        .or(attempts.first())
        .cloned()
        .ok_or_else(|| Error::Store(format!("session {id} has no attempt")))
}

/// SHA-384 (hex) of the DER of the one certificate in `pem`.
fn pem_digest(pem: &str) -> Result<String, String> {
    let mut reader = pem.as_bytes();
    let certs = rustls_pemfile::certs(&mut reader)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("the CA certificate PEM does not parse: {e}"))?;
    match certs.as_slice() {
        [one] => Ok(talos_certs::sha384_hex(one.as_ref())),
        other => Err(format!(
            "expected one CA certificate in the PEM, found {}",
            other.len()
        )),
    }
}

/// The identity of the operator running this process, for the commands it
/// commits: `TALOS_OPERATOR` when set, else the login name (`USER`,
/// `LOGNAME`), else `uid N` from the kernel.
pub fn local_operator() -> String {
    let named = |var: &str| {
        std::env::var(var)
            .ok()
            .map(|v| v.trim().to_owned())
            .filter(|v| !v.is_empty())
    };
    named("TALOS_OPERATOR")
        .or_else(|| named("USER"))
        .or_else(|| named("LOGNAME"))
        .or_else(|| {
            let status = std::fs::read_to_string("/proc/self/status").ok()?;
            let uid = status
                .lines()
                .find_map(|l| l.strip_prefix("Uid:"))?
                .split_whitespace()
                .next()?
                .to_owned();
            Some(format!("uid {uid}"))
        })
        .unwrap_or_else(|| "unknown".to_owned())
}
