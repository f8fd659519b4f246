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
//!   stop / revoke-all from any of the three; interrupt in mode agent
//!                       ▼                               ▼
//!                 the reset: ended, or reset_incomplete when a step is not confirmed
//! ```
//!
//! Each transition is one store transaction that calls the [`GatewayLink`]
//! inside it: a link that fails, or a check that fails, leaves the store as
//! it was. When the store fails after the gateways opened an authority, the
//! opening is undone with a best-effort close (reason `end`), so no gateway
//! keeps an authority the store does not know.
//!
//! What each transition does at the gateways:
//!
//! - **start** (attempt 1, cause `launch`), **resume** (`resume`) and
//!   **recover** (`recovery`) open an authority: each gateway makes a fresh
//!   CA and receives the attachments with values read from the secret store
//!   at that moment. The control stub recomputes each CA's SHA-384 digest
//!   from its PEM and records it. A resume or recovery opens with the names
//!   the session asked for that are still on the egress list, and the
//!   attachments whose secret still exists and whose destination is still
//!   listed.
//! - **pause**, **interrupt**, and **stop**/**revoke-all** of a running
//!   session drop the authority: each gateway returns a signed drop report.
//!   A report counts when the [`ReportVerifier`] accepts its signature, it
//!   names this session and attempt, the CA digest recorded when that
//!   gateway made the CA, and exactly the secret names attached at that
//!   attempt's open. Only then is the CA recorded destroyed.
//! - **stop**/**revoke-all** then run the reset. Steps 1–3 are stub
//!   responses (this control stub runs no instances). Step 4
//!   (`gateway_ca_destroyed`) is confirmed when every CA made for the
//!   session, in every attempt, was named destroyed by a report that
//!   counted; step 5 (`secrets_detached`) when, for every attempt and
//!   gateway, a report that counted named the secrets attached. A session
//!   that was paused or interrupted is confirmed from the report made then.
//!   A step not confirmed is recorded with its error and the session is
//!   `reset_incomplete`: it has ended, but its certificate is not issued.

use std::cell::Cell;
use std::collections::BTreeSet;

use serde::Serialize;
use serde_json::json;

use crate::error::Error;
use crate::link::{Attachment, CloseSession, GatewayLink, OpenSession, ReportVerifier};
use crate::model::{
    AttemptEnd, CloseReason, EndReason, Mode, OpenCause, State, OUTCOME_UNKNOWN, RESET_STEPS,
};
use crate::names::{self, AttachSpec};
use crate::store::{now, Attempt, CaEvent, DropReport, ResetStep, Session, Store, Tx};

/// The response recorded for reset steps 1–3, which this control stub
/// cannot perform: it runs no instances, security groups or credentials.
pub fn stub_response() -> serde_json::Value {
    json!({"stub": true, "note": "stub response: this control stub runs no instances"})
}

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
    /// The drop reports the transition received, as checked.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub reports: Vec<DropReport>,
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
/// reports and the reset.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Status {
    #[serde(flatten)]
    pub session: Session,
    pub attempts: Vec<AttemptStatus>,
    pub drop_reports: Vec<DropReport>,
    pub reset: Vec<ResetStep>,
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
            verifier: self.verifier,
            opening: &opening,
            relay_public_key: self.relay_public_key,
        };
        let result = self.store.write(|tx| f(tx, &ctx));
        if result.is_err() {
            if let Some((session_id, attempt)) = opening.take() {
                // Best effort: the store does not know this authority, so no
                // gateway should hold it. Its answer changes nothing here.
                let _ = self.link.close(&CloseSession {
                    session_id,
                    attempt,
                    reason: CloseReason::End,
                });
            }
        }
        result
    }

    /// `sandbox start`: check the request against the account policy and
    /// the tenant's secrets, then open attempt 1 on the gateways.
    pub fn start(&mut self, req: &StartRequest) -> Result<Transition, Error> {
        let tenant = names::tenant(&req.tenant).map_err(|e| Error::invalid(e.to_string()))?;
        let (sources, allow, attach) = names::scope(&req.sources, &req.allow, &req.attach)?;

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
            let session = Session {
                id: tx.new_session_id()?,
                tenant: tenant.clone(),
                mode: req.mode,
                state: State::Running,
                created_at: now(),
                ended_at: None,
                end_reason: None,
                outcome: None,
                allow: allow.clone(),
                attach: attach.clone(),
                sources: sources.clone(),
            };
            tx.insert_session(&session)?;
            let ca = ctx.open(tx, &session, 1, OpenCause::Launch, &allow, &attach)?;
            Ok(Transition {
                ca,
                allowlist: Some(allow.clone()),
                attachments: Some(attach.clone()),
                ..Transition::new(&session.id, State::Running, 1)
            })
        })
    }

    /// `sandbox pause`: a running session in mode commands drops its
    /// authority and waits, paused.
    pub fn pause(&mut self, id: &str) -> Result<Transition, Error> {
        self.transition(|tx, ctx| {
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
            let reports = ctx.close(tx, &session, &attempt, CloseReason::Pause)?;
            tx.end_attempt(id, attempt.n, AttemptEnd::Paused, &now())?;
            tx.set_state(id, State::Paused)?;
            Ok(Transition {
                reports,
                ..Transition::new(id, State::Paused, attempt.n)
            })
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
        self.transition(|tx, ctx| {
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
            let n = latest_attempt(tx, id)?.n + 1;
            let ca = ctx.open(tx, &session, n, cause, &allowlist, &attach)?;
            tx.set_state(id, State::Running)?;
            Ok(Transition {
                ca,
                allowlist: Some(allowlist),
                attachments: Some(attach),
                left_out,
                ..Transition::new(id, State::Running, n)
            })
        })
    }

    /// `sandbox interrupt`: the instance was lost without a pause. The
    /// gateways drop the authority; a session in mode commands waits,
    /// interrupted, and a session in mode agent ends with the outcome
    /// `outcome_unknown` (`interruption_lost`).
    pub fn interrupt(&mut self, id: &str) -> Result<Transition, Error> {
        self.transition(|tx, ctx| {
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
            let reports = ctx.close(tx, &session, &attempt, CloseReason::Interruption)?;
            tx.end_attempt(id, attempt.n, AttemptEnd::Interrupted, &now())?;
            match session.mode {
                Mode::Commands => {
                    tx.set_state(id, State::Interrupted)?;
                    Ok(Transition {
                        reports,
                        ..Transition::new(id, State::Interrupted, attempt.n)
                    })
                }
                Mode::Agent => {
                    let (state, reset) = reset(
                        tx,
                        &session,
                        EndReason::InterruptionLost,
                        Some(OUTCOME_UNKNOWN),
                    )?;
                    Ok(Transition {
                        reports,
                        end_reason: Some(EndReason::InterruptionLost),
                        outcome: Some(OUTCOME_UNKNOWN.to_owned()),
                        reset,
                        ..Transition::new(id, state, attempt.n)
                    })
                }
            }
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

    fn end(&mut self, id: &str, why: EndReason) -> Result<Transition, Error> {
        self.transition(|tx, ctx| {
            let session = load(tx, id)?;
            if session.state.is_over() {
                return Err(Error::Ended {
                    id: id.to_owned(),
                    state: session.state.as_str(),
                });
            }
            let attempt = latest_attempt(tx, id)?;
            let mut reports = Vec::new();
            if session.state == State::Running {
                let reason = match why {
                    EndReason::RevokeAll => CloseReason::RevokeAll,
                    EndReason::Stop | EndReason::InterruptionLost => CloseReason::End,
                };
                reports = ctx.close(tx, &session, &attempt, reason)?;
                tx.end_attempt(id, attempt.n, AttemptEnd::SessionEnded, &now())?;
            }
            let (state, reset) = reset(tx, &session, why, None)?;
            Ok(Transition {
                reports,
                end_reason: Some(why),
                reset,
                ..Transition::new(id, state, attempt.n)
            })
        })
    }

    /// `sandbox status`.
    pub fn status(&self, id: &str) -> Result<Status, Error> {
        status(self.store, id)
    }
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
            reset: tx.reset_steps(id)?,
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
            reports: Vec::new(),
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
        .pop()
        .ok_or_else(|| Error::Store(format!("session {id} has no attempt")))
}

/// What a transition reaches the gateways with.
struct Ctx<'a> {
    link: &'a dyn GatewayLink,
    verifier: &'a dyn ReportVerifier,
    opening: &'a Opening,
    relay_public_key: Option<[u8; 32]>,
}

impl Ctx<'_> {
    /// Open attempt `n` on the gateways, with values read now, and record
    /// the attempt and the CAs made.
    fn open(
        &self,
        tx: &Tx<'_>,
        session: &Session,
        n: u32,
        cause: OpenCause,
        allowlist: &[String],
        attach: &[AttachSpec],
    ) -> Result<Vec<CaView>, Error> {
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
        let opened = self.link.open(&req)?;
        self.opening.set(Some((session.id.clone(), n)));
        drop(req);

        if opened.is_empty() {
            return Err(Error::GatewayReplyInvalid {
                gateway_id: "(none)".into(),
                reason: "no gateway opened the session".into(),
            });
        }
        let mut out = Vec::new();
        for o in &opened {
            let bad = |reason: String| Error::GatewayReplyInvalid {
                gateway_id: o
                    .gateway_id
                    .chars()
                    .take(names::MAX_GATEWAY_ID_LEN)
                    .collect(),
                reason,
            };
            names::gateway_id(&o.gateway_id).map_err(|e| bad(e.to_string()))?;
            if out.iter().any(|c: &CaView| c.gateway_id == o.gateway_id) {
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
                    destroyed_at: None,
                    destroy_reason: None,
                },
            )?;
            out.push(CaView {
                gateway_id: o.gateway_id.clone(),
                digest,
            });
        }
        Ok(out)
    }

    /// Drop the attempt's authority on the gateways and record each report,
    /// checked against what was recorded at the attempt's open.
    fn close(
        &self,
        tx: &Tx<'_>,
        session: &Session,
        attempt: &Attempt,
        reason: CloseReason,
    ) -> Result<Vec<DropReport>, Error> {
        let views = self.link.close(&CloseSession {
            session_id: session.id.clone(),
            attempt: attempt.n,
            reason,
        })?;
        // The gateways dropped what they held, pending approvals with it: a
        // card still showing would be decided for nothing.
        tx.withdraw_proposals(&session.id, &now())?;
        let cas: Vec<CaEvent> = tx
            .cas(&session.id)?
            .into_iter()
            .filter(|c| c.attempt == attempt.n)
            .collect();
        let attached: BTreeSet<&str> = attempt
            .attachments
            .iter()
            .map(|a| a.secret.as_str())
            .collect();
        let at = now();
        let mut out = Vec::new();
        for view in &views {
            let key = tx.gateway_key(&view.gateway_id)?;
            let ca = cas.iter().find(|c| c.gateway_id == view.gateway_id);
            let common = match self.verifier.verify(view, key.as_deref()) {
                Err(e) => Some(format!("signature: {e}")),
                Ok(()) if view.session_id != session.id => Some(format!(
                    "the report names session {}, not {}",
                    view.session_id, session.id
                )),
                Ok(()) if view.attempt != attempt.n => Some(format!(
                    "the report names attempt {}, not {}",
                    view.attempt, attempt.n
                )),
                Ok(()) if ca.is_none() => Some(format!(
                    "gateway {} made no CA for attempt {}",
                    view.gateway_id, attempt.n
                )),
                Ok(()) => None,
            };
            let ca_error = common.clone().or_else(|| {
                let recorded = &ca?.digest;
                (!view.ca_digest.eq_ignore_ascii_case(recorded)).then(|| {
                    format!(
                        "the report names CA {}, but the CA recorded at open is {recorded}",
                        view.ca_digest
                    )
                })
            });
            let reported: BTreeSet<&str> = view.secrets.iter().map(String::as_str).collect();
            let secrets_error = common.or_else(|| {
                (reported != attached).then(|| {
                    format!(
                        "the report names secrets {:?}, but {:?} were attached at open",
                        reported, attached
                    )
                })
            });
            if ca_error.is_none() {
                tx.mark_ca_destroyed(
                    &session.id,
                    attempt.n,
                    &view.gateway_id,
                    &view.ca_digest.to_ascii_lowercase(),
                    reason,
                    &at,
                )?;
            }
            let report = DropReport {
                attempt: attempt.n,
                gateway_id: view.gateway_id.clone(),
                reason,
                ca_digest: view.ca_digest.to_ascii_lowercase(),
                secrets: view.secrets.clone(),
                report_digest: talos_certs::sha384_hex(&view.signed),
                received_at: at.clone(),
                verifier: self.verifier.describe().to_owned(),
                ca_error,
                secrets_error,
            };
            tx.insert_drop_report(&session.id, &report, &view.signed)?;
            out.push(report);
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

/// Run the sandbox reset and mark the session over: `ended` when all five
/// steps are confirmed, `reset_incomplete` otherwise.
fn reset(
    tx: &Tx<'_>,
    session: &Session,
    why: EndReason,
    outcome: Option<&str>,
) -> Result<(State, Vec<ResetStep>), Error> {
    let at = now();
    // Nothing of an ended session can be decided any more.
    tx.withdraw_proposals(&session.id, &at)?;
    let cas = tx.cas(&session.id)?;
    let reports = tx.drop_reports(&session.id)?;
    let attempts = tx.attempts(&session.id)?;
    let counted = |attempt: u32, gateway: &str| -> Vec<&DropReport> {
        reports
            .iter()
            .filter(|r| r.attempt == attempt && r.gateway_id == gateway)
            .collect()
    };

    let mut steps: Vec<ResetStep> = RESET_STEPS[..3]
        .iter()
        .enumerate()
        .map(|(i, name)| ResetStep {
            step: step_number(i),
            name: (*name).to_owned(),
            confirmed: true,
            response: stub_response(),
            error: None,
            at: at.clone(),
        })
        .collect();

    // Step 4: every CA made for the session named destroyed by a report
    // that counted, with the digest recorded when it was made.
    let mut ca_errors = Vec::new();
    let mut ca_items = Vec::new();
    for ca in &cas {
        let good = counted(ca.attempt, &ca.gateway_id)
            .into_iter()
            .find(|r| r.ca_error.is_none() && r.ca_digest.eq_ignore_ascii_case(&ca.digest));
        match good {
            Some(r) => ca_items.push(json!({
                "attempt": ca.attempt,
                "gateway_id": ca.gateway_id,
                "digest": ca.digest,
                "destroyed_at": r.received_at,
                "reason": r.reason,
                "report_digest": r.report_digest,
            })),
            None => {
                let why = counted(ca.attempt, &ca.gateway_id)
                    .into_iter()
                    .rev()
                    .find_map(|r| r.ca_error.clone())
                    .unwrap_or_else(|| "no drop report from this gateway".into());
                ca_errors.push(format!(
                    "attempt {}, gateway {}, CA {}: {why}",
                    ca.attempt, ca.gateway_id, ca.digest
                ));
                ca_items.push(json!({
                    "attempt": ca.attempt,
                    "gateway_id": ca.gateway_id,
                    "digest": ca.digest,
                    "destroyed_at": null,
                    "error": why,
                }));
            }
        }
    }
    steps.push(gateway_step(
        3,
        json!({
            "check": "each CA made for the session is named by a verified drop report with the digest recorded when the gateway made it",
            "cas": ca_items,
        }),
        ca_errors,
        &at,
    ));

    // Step 5: for every attempt and gateway, a report that counted named
    // exactly the secrets attached at that attempt's open.
    let mut secret_errors = Vec::new();
    let mut secret_items = Vec::new();
    for attempt in &attempts {
        let mut attached: Vec<&str> = attempt
            .attachments
            .iter()
            .map(|a| a.secret.as_str())
            .collect();
        attached.sort_unstable();
        attached.dedup();
        for ca in cas.iter().filter(|c| c.attempt == attempt.n) {
            let good = counted(attempt.n, &ca.gateway_id)
                .into_iter()
                .find(|r| r.secrets_error.is_none());
            match good {
                Some(r) => secret_items.push(json!({
                    "attempt": attempt.n,
                    "gateway_id": ca.gateway_id,
                    "attached": attached,
                    "reported": r.secrets,
                    "report_digest": r.report_digest,
                })),
                None => {
                    let why = counted(attempt.n, &ca.gateway_id)
                        .into_iter()
                        .rev()
                        .find_map(|r| r.secrets_error.clone())
                        .unwrap_or_else(|| "no drop report from this gateway".into());
                    secret_errors.push(format!(
                        "attempt {}, gateway {}: {why}",
                        attempt.n, ca.gateway_id
                    ));
                    secret_items.push(json!({
                        "attempt": attempt.n,
                        "gateway_id": ca.gateway_id,
                        "attached": attached,
                        "error": why,
                    }));
                }
            }
        }
    }
    steps.push(gateway_step(
        4,
        json!({
            "check": "for each attempt and gateway, a verified drop report names exactly the secrets attached at the attempt's open",
            "detached": secret_items,
        }),
        secret_errors,
        &at,
    ));

    for step in &steps {
        tx.insert_reset_step(&session.id, step)?;
    }
    let state = if steps.iter().all(|s| s.confirmed) {
        State::Ended
    } else {
        State::ResetIncomplete
    };
    tx.set_ended(&session.id, state, why, outcome, &at)?;
    Ok((state, steps))
}

fn gateway_step(
    index: usize,
    response: serde_json::Value,
    errors: Vec<String>,
    at: &str,
) -> ResetStep {
    ResetStep {
        step: step_number(index),
        name: RESET_STEPS[index].to_owned(),
        confirmed: errors.is_empty(),
        response,
        error: (!errors.is_empty()).then(|| errors.join("; ")),
        at: at.to_owned(),
    }
}

/// Step numbers run from 1; there are five.
fn step_number(index: usize) -> u8 {
    u8::try_from(index + 1).unwrap_or(u8::MAX)
}
