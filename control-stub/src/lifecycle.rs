//! The session state machine: the gateway's columns of the spec's behaviour
//! table ("Sandbox sessions").
//!
//! ```text
//!            start                pause (mode commands)
//!   ─────────────────► running ──────────────────────► paused
//!                       │  ▲  ◄──────────────────────── │
//!                       │  │          resume            │
//!        interrupt      │  │ recover                    │
//!   (mode commands)     ▼  │                            │
//!                    interrupted                        │
//!                       │                               │
//!   stop / revoke-all from any state before the end; interrupt in mode agent
//!                       ▼                               ▼
//!        stopping ──► ended, or reset_incomplete until every gateway confirms
//! ```
//!
//! # Opening: on every member that answers
//!
//! **start** (attempt 1, cause `launch`), **resume** (`resume`) and
//! **recover** (`recovery`) open an authority on every member of the pair
//! at once, inside the store transaction that records the attempt: each
//! member makes a fresh CA and receives the attachments with values read
//! from the secret store at that moment. The control stub recomputes each
//! CA's SHA-384 digest from its PEM and records it, with the member process
//! that made it. A resume or recovery opens with the names the session
//! asked for that are still on the egress list, and the attachments whose
//! secret still exists and whose destination is still listed.
//!
//! A member that cannot be reached does not stop the session: it goes on
//! through the members that opened (its trust bundle holds their CAs), and
//! a close is owed to the unreachable member in case the open reached it
//! unseen. A member that *refuses*, or answers something that does not hold
//! together, fails the transition: the members that opened are closed again
//! and nothing is recorded. With no member opened, a start fails
//! `gateway_unreachable`; a resume or recovery fails too, and its attempt is
//! recorded ended `start_failed` (the session stays paused or interrupted).
//!
//! # Closing: the control plane decides, the members follow
//!
//! **pause**, **interrupt**, **stop** and **revoke-all** commit first, in one
//! transaction: the new state (`paused`, `interrupted`, or `stopping`), the
//! attempt's end, every pending approval withdrawn, and a close owed to
//! every member whose CA is not yet confirmed destroyed. Only then are the
//! members asked, all at once, each within the link's deadline; each answer
//! is recorded as it is ([`crate::confirm`]). A member that does not confirm
//! leaves its close owed: `control-stub serve` asks again, with growing
//! delays, until the member's signed word is in — a drop report in a reply
//! or in its batch chain, or its successor's start report — and the
//! member's lease ends the authority meanwhile if nobody renews it. So
//! these commands work whatever members are down, hung or restarted, and
//! never leave authority live anywhere once the lease has run.
//!
//! **stop**/**revoke-all** then run the reset: steps 1–3 are stub responses
//! (this control stub runs no instances); step 4 (`gateway_ca_destroyed`)
//! and step 5 (`secrets_detached`) are confirmed by the gateways' signed
//! words for every attempt. The session is `reset_incomplete` while a close
//! is owed, and `ended` once every step is confirmed; its certificate is
//! issued after that ([`crate::certificate`]).

use std::cell::Cell;
use std::collections::BTreeSet;
use std::time::SystemTime;

use serde::Serialize;

use crate::confirm;
use crate::error::{Error, LinkError};
use crate::link::{Attachment, CloseSession, GatewayLink, OpenSession, ReportVerifier};
use crate::model::{
    limits, AttemptEnd, CloseReason, EndReason, IdleAction, Mode, OpenCause, State, OUTCOME_UNKNOWN,
};
use crate::names::{self, AttachSpec};
use crate::store::{now, Attempt, CaEvent, CloseTask, DropReport, ResetStep, Session, Store, Tx};

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
    /// Whether the certificate is issued.
    pub certificate_issued: bool,
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
}

impl std::fmt::Debug for Lifecycle<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lifecycle")
            .field("store", &self.store.path())
            .field("verifier", &self.verifier.describe())
            .finish_non_exhaustive()
    }
}

/// Set once a gateway opened an authority inside the current transaction:
/// (session, attempt), for the undo if the transaction then fails.
type Opening = Cell<Option<(String, u32)>>;

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
        }
    }

    /// Open sessions with the approval relay's public key, so the gateways
    /// accept its decisions. Without one (the default) the gateways are
    /// told there is no relay, and refuse what the Lock holds at once.
    pub fn with_relay_key(mut self, key: Option<[u8; 32]>) -> Lifecycle<'a> {
        self.relay_public_key = key;
        self
    }

    /// Run `f` in one write transaction; if it fails after a gateway opened
    /// an authority, drop that authority again.
    fn transition<T>(
        &mut self,
        f: impl FnOnce(&Tx<'_>, &Ctx<'_>) -> Result<T, Error>,
    ) -> Result<T, Error> {
        let opening: Opening = Cell::new(None);
        let ctx = Ctx {
            link: self.link,
            opening: &opening,
            relay_public_key: self.relay_public_key,
        };
        let result = self.store.write(|tx| f(tx, &ctx));
        if result.is_err() {
            if let Some((session_id, attempt)) = opening.take() {
                // Best effort: the store does not know this authority, so no
                // gateway should hold it; and nobody renews its lease.
                let _ = self.link.close(
                    &CloseSession {
                        session_id,
                        attempt,
                        reason: CloseReason::End,
                    },
                    None,
                );
            }
        }
        result
    }

    /// `sandbox start`: check the request against the account policy and
    /// the tenant's secrets, then open attempt 1 on the gateways.
    pub fn start(&mut self, req: &StartRequest) -> Result<Transition, Error> {
        let tenant = names::tenant(&req.tenant).map_err(|e| Error::invalid(e.to_string()))?;
        let (sources, allow, attach) = names::scope(&req.sources, &req.allow, &req.attach)?;
        let (idle_timeout_seconds, idle_action) = idle_settings(req)?;

        self.transition(|tx, ctx| {
            let egress: BTreeSet<String> = tx.egress_names()?.into_iter().collect();
            if let Some(name) = allow.iter().find(|n| !egress.contains(*n)) {
                return Err(Error::DestinationNotAllowed { name: name.clone() });
            }
            for spec in &attach {
                if !tx.secret_exists(&tenant, &spec.secret)? {
                    return Err(Error::SecretNotFound {
                        tenant: tenant.clone(),
                        name: spec.secret.clone(),
                    });
                }
            }
            for live in tx.live_sessions()? {
                if let Some(addr) = sources.iter().find(|a| live.sources.contains(a)) {
                    return Err(Error::SourceInUse {
                        source_addr: addr.to_string(),
                        session_id: live.id,
                    });
                }
            }
            let at = now();
            let session = Session {
                id: tx.new_session_id()?,
                tenant: tenant.clone(),
                mode: req.mode,
                state: State::Running,
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
            };
            tx.insert_session(&session)?;
            let opened = ctx.open(tx, &session, 1, OpenCause::Launch, &allow, &attach)?;
            Ok(Transition {
                ca: opened.ca,
                unreached: opened.unreached,
                allowlist: Some(allow.clone()),
                attachments: Some(attach.clone()),
                ..Transition::new(&session.id, State::Running, 1)
            })
        })
    }

    /// `sandbox pause`: a running session in mode commands drops its
    /// authority and waits, paused.
    pub fn pause(&mut self, id: &str) -> Result<Transition, Error> {
        let (session, attempt) = self.store.write(|tx| {
            let session = load(tx, id)?;
            if session.mode == Mode::Agent {
                return Err(Error::PauseUnavailable { id: id.to_owned() });
            }
            if session.state != State::Running {
                return Err(Error::NotRunning {
                    id: id.to_owned(),
                    state: session.state.as_str(),
                });
            }
            let attempt = latest_attempt(tx, id)?;
            let at = now();
            tx.end_attempt(id, attempt.n, AttemptEnd::Paused, &at)?;
            tx.set_state(id, State::Paused)?;
            tx.withdraw_proposals(id, &at)?;
            owe_closes(tx, id, Some(attempt.n), CloseReason::Pause)?;
            Ok((session, attempt))
        })?;
        let reports = self.ask_owed(&session.id)?;
        Ok(Transition {
            reports,
            closes_owed: self.owed(&session.id)?,
            ..Transition::new(id, State::Paused, attempt.n)
        })
    }

    /// `sandbox resume`: a paused session opens a new attempt from the
    /// current policy and secrets.
    pub fn resume(&mut self, id: &str) -> Result<Transition, Error> {
        self.reopen(id, OpenCause::Resume)
    }

    /// `sandbox recover`: an interrupted session (mode commands) opens a new
    /// attempt, as a resume does.
    pub fn recover(&mut self, id: &str) -> Result<Transition, Error> {
        self.reopen(id, OpenCause::Recovery)
    }

    fn reopen(&mut self, id: &str, cause: OpenCause) -> Result<Transition, Error> {
        let attempted: Cell<Option<u32>> = Cell::new(None);
        let result = self.transition(|tx, ctx| {
            let session = load(tx, id)?;
            let from = match cause {
                OpenCause::Recovery => State::Interrupted,
                OpenCause::Resume | OpenCause::Launch => State::Paused,
            };
            if session.state.is_over() {
                return Err(Error::Ended {
                    id: id.to_owned(),
                    state: session.state.as_str(),
                });
            }
            if session.state != from {
                let state = session.state.as_str();
                return Err(match cause {
                    OpenCause::Recovery => Error::NotInterrupted {
                        id: id.to_owned(),
                        state,
                    },
                    OpenCause::Resume | OpenCause::Launch => Error::NotPaused {
                        id: id.to_owned(),
                        state,
                    },
                });
            }
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
            // Numbered after every attempt, a failed start's too.
            let n = tx.attempts(id)?.last().map_or(0, |a| a.n) + 1;
            attempted.set(Some(n));
            let opened = ctx.open(tx, &session, n, cause, &allowlist, &attach)?;
            tx.set_state(id, State::Running)?;
            tx.touch(id, &now())?;
            Ok(Transition {
                ca: opened.ca,
                unreached: opened.unreached,
                allowlist: Some(allowlist),
                attachments: Some(attach),
                left_out,
                ..Transition::new(id, State::Running, n)
            })
        });
        // "If the instance does not start, the session returns to paused.
        // The attempt ends with the reason start_failed." Here: no gateway
        // opened the authority.
        if let (Err(Error::Link(LinkError::Unreachable(_))), Some(n)) = (&result, attempted.get()) {
            self.store.write(|tx| {
                let at = now();
                let session = load(tx, id)?;
                tx.insert_attempt(
                    id,
                    &Attempt {
                        n,
                        cause,
                        started_at: at.clone(),
                        ended_at: Some(at),
                        end_cause: Some(AttemptEnd::StartFailed),
                        allowlist: Vec::new(),
                        attachments: Vec::new(),
                        lock: Vec::new(),
                        relay_public_key: None,
                    },
                )?;
                let _ = session;
                Ok(())
            })?;
        }
        result
    }

    /// `sandbox interrupt`: the instance was lost without a pause. The
    /// gateways drop the authority; a session in mode commands waits,
    /// interrupted, and a session in mode agent ends with the outcome
    /// `outcome_unknown` (`interruption_lost`).
    pub fn interrupt(&mut self, id: &str) -> Result<Transition, Error> {
        let (session, attempt) = self.store.write(|tx| {
            let session = load(tx, id)?;
            if session.state.is_over() {
                return Err(Error::Ended {
                    id: id.to_owned(),
                    state: session.state.as_str(),
                });
            }
            if session.state != State::Running {
                return Err(Error::NotRunning {
                    id: id.to_owned(),
                    state: session.state.as_str(),
                });
            }
            let attempt = latest_attempt(tx, id)?;
            let at = now();
            tx.end_attempt(id, attempt.n, AttemptEnd::Interrupted, &at)?;
            tx.withdraw_proposals(id, &at)?;
            match session.mode {
                Mode::Commands => {
                    tx.set_state(id, State::Interrupted)?;
                    owe_closes(tx, id, Some(attempt.n), CloseReason::Interruption)?;
                }
                Mode::Agent => commit_end(
                    tx,
                    &session,
                    EndReason::InterruptionLost,
                    Some(OUTCOME_UNKNOWN),
                    CloseReason::Interruption,
                )?,
            }
            Ok((session, attempt))
        })?;
        let reports = self.ask_owed(&session.id)?;
        if session.mode == Mode::Agent {
            let mut t = self.finish_end(&session.id, EndReason::InterruptionLost)?;
            t.reports = reports;
            return Ok(t);
        }
        Ok(Transition {
            reports,
            closes_owed: self.owed(&session.id)?,
            ..Transition::new(id, State::Interrupted, attempt.n)
        })
    }

    /// `sandbox stop`: a cancellation, from any state before the end.
    pub fn stop(&mut self, id: &str) -> Result<Transition, Error> {
        self.end(id, EndReason::Stop)
    }

    /// `sandbox revoke-all`: a cancellation as Revoke All.
    pub fn revoke_all(&mut self, id: &str) -> Result<Transition, Error> {
        self.end(id, EndReason::RevokeAll)
    }

    /// End the session for `why`, from any state before the end: the end
    /// is committed first, then every member is asked to close (see the
    /// module docs). Also what the time-driven events end sessions with.
    pub fn end(&mut self, id: &str, why: EndReason) -> Result<Transition, Error> {
        let outcome = match why {
            EndReason::InterruptionLost => Some(OUTCOME_UNKNOWN),
            _ => None,
        };
        let close = match why {
            EndReason::RevokeAll => CloseReason::RevokeAll,
            _ => CloseReason::End,
        };
        self.store.write(|tx| {
            let session = load(tx, id)?;
            if session.state.is_over() {
                return Err(Error::Ended {
                    id: id.to_owned(),
                    state: session.state.as_str(),
                });
            }
            commit_end(tx, &session, why, outcome, close)
        })?;
        let reports = self.ask_owed(id)?;
        let mut t = self.finish_end(id, why)?;
        t.reports = reports;
        Ok(t)
    }

    /// The reset, run once the members have been asked: the transition a
    /// stop, a Revoke All or an agent's interruption shows.
    fn finish_end(&mut self, id: &str, why: EndReason) -> Result<Transition, Error> {
        let (state, attempt, reset, outcome) = self.store.write(|tx| {
            let session = load(tx, id)?;
            let (state, reset) = confirm::reset(tx, &session, why, session.outcome.as_deref())?;
            Ok((state, latest_attempt(tx, id)?.n, reset, session.outcome))
        })?;
        Ok(Transition {
            end_reason: Some(why),
            outcome,
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

    /// `sandbox attach`: a client attached; idle time counts from now.
    pub fn attach(&mut self, id: &str) -> Result<Status, Error> {
        self.store.write(|tx| {
            let session = load(tx, id)?;
            if !session.state.is_over() {
                tx.touch(id, &now())?;
            }
            Ok(())
        })?;
        status(self.store, id)
    }

    /// `sandbox status`.
    pub fn status(&self, id: &str) -> Result<Status, Error> {
        status(self.store, id)
    }
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

/// Commit a session's end: state `stopping`, why, every pending approval
/// withdrawn, the running attempt ended, and a close owed to every member
/// whose CA, of any attempt, is not yet confirmed destroyed.
fn commit_end(
    tx: &Tx<'_>,
    session: &Session,
    why: EndReason,
    outcome: Option<&str>,
    close: CloseReason,
) -> Result<(), Error> {
    let at = now();
    let attempt = latest_attempt(tx, &session.id)?;
    if attempt.ended_at.is_none() {
        tx.end_attempt(&session.id, attempt.n, AttemptEnd::SessionEnded, &at)?;
    }
    tx.withdraw_proposals(&session.id, &at)?;
    tx.set_ended(&session.id, State::Stopping, why, outcome, &at)?;
    owe_closes(tx, &session.id, None, close)
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
        let attempts = tx
            .attempts(id)?
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
        Ok(Status {
            session,
            attempts,
            drop_reports: tx.drop_reports(id)?,
            closes: tx.close_tasks(id)?,
            reset: tx.reset_steps(id)?,
            certificate_issued: tx.issued_certificate(id)?.is_some(),
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

fn latest_attempt(tx: &Tx<'_>, id: &str) -> Result<Attempt, Error> {
    tx.attempts(id)?
        .into_iter()
        .rev()
        .find(|a| a.end_cause != Some(AttemptEnd::StartFailed))
        .ok_or_else(|| Error::Store(format!("session {id} has no attempt")))
}

/// What an open made.
struct Opened {
    ca: Vec<CaView>,
    unreached: Vec<Unreached>,
}

/// What a transition reaches the gateways with.
struct Ctx<'a> {
    link: &'a dyn GatewayLink,
    opening: &'a Opening,
    relay_public_key: Option<[u8; 32]>,
}

impl Ctx<'_> {
    /// Open attempt `n` on the gateways, with values read now, and record
    /// the attempt, the CAs made, and the closes owed to the members that
    /// could not be reached.
    fn open(
        &self,
        tx: &Tx<'_>,
        session: &Session,
        n: u32,
        cause: OpenCause,
        allowlist: &[String],
        attach: &[AttachSpec],
    ) -> Result<Opened, Error> {
        let at = now();
        // The rules as they stand now travel with the session; the gateway
        // counts first_use afresh under this authority.
        let lock = tx.lock_rules()?;
        tx.insert_attempt(
            &session.id,
            &Attempt {
                n,
                cause,
                started_at: at.clone(),
                ended_at: None,
                end_cause: None,
                allowlist: allowlist.to_vec(),
                attachments: attach.to_vec(),
                lock: lock.clone(),
                relay_public_key: self.relay_public_key.map(hex::encode),
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
        let req = OpenSession {
            session_id: session.id.clone(),
            attempt: n,
            tenant: session.tenant.clone(),
            sources: session.sources.clone(),
            allowlist: allowlist.to_vec(),
            attachments,
            cause,
            lock,
            relay_public_key: self.relay_public_key,
        };
        let replies = self.link.open(&req);
        drop(req);
        if replies.iter().any(|r| r.result.is_ok()) {
            self.opening.set(Some((session.id.clone(), n)));
        }
        // A refusal or a reply that does not hold together fails the whole
        // open (the transition then closes what opened); members that did
        // not answer do not.
        let mut out = Opened {
            ca: Vec::new(),
            unreached: Vec::new(),
        };
        let mut first_unreachable = None;
        for r in &replies {
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
                Err(e) => return Err(Error::Link(e.clone())),
            };
            let bad = |reason: String| Error::GatewayReplyInvalid {
                gateway_id: o
                    .gateway_id
                    .chars()
                    .take(names::MAX_GATEWAY_ID_LEN)
                    .collect(),
                reason,
            };
            names::gateway_id(&o.gateway_id).map_err(|e| bad(e.to_string()))?;
            if out.ca.iter().any(|c: &CaView| c.gateway_id == o.gateway_id) {
                return Err(bad("the gateway answered twice".into()));
            }
            let digest = pem_digest(&o.ca_cert_pem).map_err(bad)?;
            if !digest.eq_ignore_ascii_case(&o.ca_digest) {
                return Err(bad(format!(
                    "the stated CA digest {} is not the certificate's ({digest})",
                    o.ca_digest
                )));
            }
            tx.insert_ca(
                &session.id,
                &CaEvent {
                    attempt: n,
                    gateway_id: o.gateway_id.clone(),
                    digest: digest.clone(),
                    cert_pem: o.ca_cert_pem.clone(),
                    made_at: at.clone(),
                    instance: Some(o.instance.clone()).filter(|i| !i.is_empty()),
                    destroyed_at: None,
                    destroy_reason: None,
                    destroy_report: None,
                },
            )?;
            if !o.instance.is_empty() {
                tx.gateway_seen(&o.gateway_id, &o.instance, o.lease_ms, &at)?;
            }
            out.ca.push(CaView {
                gateway_id: o.gateway_id.clone(),
                digest,
            });
        }
        if out.ca.is_empty() {
            return Err(match first_unreachable {
                Some(e) => Error::Link(e),
                None => Error::GatewayReplyInvalid {
                    gateway_id: "(none)".into(),
                    reason: "no gateway opened the session".into(),
                },
            });
        }
        // A member that did not answer may have opened it all the same:
        // owe it a close, and its lease ends it meanwhile.
        for u in &out.unreached {
            // Named by its id (an address given without one is not a
            // gateway id: nothing to key a close on).
            if names::gateway_id(&u.gateway).is_ok() {
                tx.insert_close_task(&session.id, n, &u.gateway, CloseReason::End, &at)?;
            }
        }
        Ok(out)
    }
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
