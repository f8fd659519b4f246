//! What confirms that a session's authority is gone from a gateway, and
//! the reset steps that rest on it.
//!
//! A gateway's signed word comes three ways, and each goes through here:
//!
//! - the **reply** to a close ([`close_answered`]): a drop report, or "not
//!   held";
//! - an entry of its **batch chain** ([`chain_drop_report`]): every drop
//!   report the gateway signs — for a close, a lease that lapsed, an
//!   authority a newer open replaced, a shutdown — goes into its chain after
//!   the records of the authority's connections, so it arrives even when
//!   the close's reply did not;
//! - a **start report** in its chain ([`start_report`]): the process that
//!   held the authority is gone, so is everything it held.
//!
//! A drop report counts when its signature verifies under the gateway's
//! registered key, it names the session and attempt, the CA digest
//! recorded when that gateway made the CA, and exactly the secret names
//! attached at that attempt's open. A counted report marks the CA
//! destroyed and settles the close owed for it. Each confirmation then
//! re-runs the reset of a session that is over ([`reevaluate`]): steps 4
//! and 5 are recorded again, and once all five are confirmed the session
//! is `ended`, or `failed` if it never ran (the state the machine gives the
//! reset's progress, [`crate::machine`]). A verified report for an attempt
//! of which no CA of that gateway is recorded (an open whose answer was
//! lost) destroys nothing recorded, but settles the close owed in case the
//! open reached it.
//!
//! What the session's certificate waits for is decided here too
//! ([`certificate_waits_for`]): the reset, and every member's signed
//! batches through the end of its part — a holder's through its drop
//! report or its next start report, a forwarder's through its hand-off
//! records of the connections it passed on ([`records_awaited`]).
//!
//! A close that fails is owed again after a delay that doubles from
//! [`RETRY_FIRST`] up to [`RETRY_CAP`].

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, SystemTime};

use serde_json::json;

use crate::error::{Error, LinkError};
use crate::link::{CloseAnswer, DropReportView, ReportVerifier};
use crate::machine::{self, Event};
use crate::model::{CloseReason, State, RESET_STEPS};
use crate::store::{
    ed25519_key, now, Attempt, CaEvent, CloseTask, DropReport, ResetStep, Session, Tx,
};

/// The first delay before an owed close is asked again.
pub const RETRY_FIRST: Duration = Duration::from_secs(1);
/// The longest delay between two asks: a gateway that comes back is asked
/// within a minute.
pub const RETRY_CAP: Duration = Duration::from_secs(60);

/// The response recorded for reset steps 1–3, which this control stub
/// cannot perform: it runs no instances, security groups or credentials.
pub fn stub_response() -> serde_json::Value {
    json!({"stub": true, "note": "stub response: this control stub runs no instances"})
}

/// When an owed close that has failed `tries` times is asked again.
pub fn retry_at(from: SystemTime, tries: u32) -> String {
    let delay = RETRY_FIRST
        .saturating_mul(1u32.checked_shl(tries.min(16)).unwrap_or(u32::MAX))
        .min(RETRY_CAP);
    humantime::format_rfc3339_millis(from + delay).to_string()
}

/// The control stub's word for why a report names a reason, as the store
/// keeps it.
fn reason_of(view: &DropReportView, asked: CloseReason) -> CloseReason {
    CloseReason::parse(&view.reason).unwrap_or(asked)
}

/// Check `view` against what was recorded at its attempt's open and record
/// it (`via` `reply`, or `chain` with its batch); a report that counts
/// marks the CA destroyed and settles the owed close. Returns the report as
/// recorded.
pub fn record_report(
    tx: &Tx<'_>,
    verifier: &dyn ReportVerifier,
    view: &DropReportView,
    asked: CloseReason,
    via: (&str, Option<u64>),
) -> Result<DropReport, Error> {
    let session_id = &view.session_id;
    let key = tx.gateway_key(&view.gateway_id)?;
    let attempt = tx
        .attempts(session_id)?
        .into_iter()
        .find(|a| a.n == view.attempt);
    let cas = tx.cas(session_id)?;
    let ca = cas
        .iter()
        .find(|c| c.attempt == view.attempt && c.gateway_id == view.gateway_id);
    let attached: BTreeSet<&str> = attempt
        .iter()
        .flat_map(|a| a.attachments.iter().map(|x| x.secret.as_str()))
        .collect();
    let verified = verifier.verify(view, key.as_deref());
    // The gateway's signed word that an authority gone of which no CA is
    // recorded here: an open whose answer never came (or came after its
    // session ended). Nothing recorded is destroyed by it, but the close
    // owed in case that open reached the gateway is settled.
    let unrecorded = verified.is_ok() && attempt.is_some() && ca.is_none();
    let common = match verified {
        Err(e) => Some(format!("signature: {e}")),
        Ok(()) if attempt.is_none() => Some(format!(
            "session {session_id} has no attempt {}",
            view.attempt
        )),
        Ok(()) if ca.is_none() => Some(format!(
            "gateway {} made no CA for attempt {}",
            view.gateway_id, view.attempt
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
    let at = now();
    let reason = reason_of(view, asked);
    let report = DropReport {
        attempt: view.attempt,
        gateway_id: view.gateway_id.clone(),
        reason,
        ca_digest: view.ca_digest.to_ascii_lowercase(),
        secrets: view.secrets.clone(),
        instance: Some(view.instance.clone()).filter(|i| !i.is_empty()),
        via: via.0.to_owned(),
        batch_seq: via.1,
        report_digest: talos_certs::sha384_hex(&view.signed),
        received_at: at.clone(),
        verifier: verifier.describe().to_owned(),
        ca_error,
        secrets_error,
    };
    if report.ca_error.is_none() {
        tx.mark_ca_destroyed(
            session_id,
            view.attempt,
            &view.gateway_id,
            &report.ca_digest,
            reason,
            &report.report_digest,
            &at,
        )?;
    }
    if unrecorded || (report.ca_error.is_none() && report.secrets_error.is_none()) {
        tx.confirm_close(session_id, view.attempt, &view.gateway_id, via.0, &at)?;
    }
    tx.insert_drop_report(session_id, &report, &view.signed)?;
    Ok(report)
}

/// Record one member's answer to a close of `attempt` of `session_id`,
/// owed to it for `asked`: a report is checked and recorded; "not held"
/// settles the close only when no CA of that member is recorded for the
/// attempt (there is nothing to confirm); anything else leaves the close
/// owed, with the error and the time of the next ask.
#[allow(clippy::too_many_arguments)]
pub fn close_answered(
    tx: &Tx<'_>,
    verifier: &dyn ReportVerifier,
    session_id: &str,
    attempt: u32,
    gateway_id: &str,
    asked: CloseReason,
    answer: &Result<CloseAnswer, LinkError>,
    clock: SystemTime,
) -> Result<Option<DropReport>, Error> {
    let tries = tx
        .close_tasks(session_id)?
        .into_iter()
        .find(|t| t.attempt == attempt && t.gateway_id == gateway_id)
        .map_or(0, |t| t.tries);
    let next = retry_at(clock, tries);
    match answer {
        Ok(CloseAnswer::Report(view)) => {
            if view.gateway_id != gateway_id
                || view.session_id != session_id
                || view.attempt != attempt
            {
                tx.close_failed(
                    session_id,
                    attempt,
                    gateway_id,
                    &format!(
                        "the report names gateway {}, session {}, attempt {}",
                        view.gateway_id, view.session_id, view.attempt
                    ),
                    &next,
                )?;
                return Ok(None);
            }
            let report = record_report(tx, verifier, view, asked, ("reply", None))?;
            if report.ca_error.is_some() || report.secrets_error.is_some() {
                let why = report
                    .ca_error
                    .clone()
                    .or_else(|| report.secrets_error.clone())
                    .unwrap_or_default();
                tx.close_failed(session_id, attempt, gateway_id, &why, &next)?;
            } else if let Some(instance) = &report.instance {
                tx.gateway_seen_instance(gateway_id, instance)?;
            }
            Ok(Some(report))
        }
        Ok(CloseAnswer::NotHeld { instance, message }) => {
            let ca = tx
                .cas(session_id)?
                .into_iter()
                .find(|c| c.attempt == attempt && c.gateway_id == gateway_id);
            match ca {
                None => {
                    // Nothing was recorded of this member for the attempt:
                    // the close was owed only in case an open had reached
                    // it unseen, and it says it holds nothing.
                    tx.confirm_close(session_id, attempt, gateway_id, "not_held", &now())?;
                }
                Some(ca) => {
                    let note = match (&ca.instance, instance) {
                        (Some(made), Some(now_running)) if made != now_running => format!(
                            "the gateway restarted (instance {now_running}; the CA was made by {made}); waiting for its start report"
                        ),
                        _ => format!(
                            "the gateway holds no such authority ({message}); waiting for its drop report in its batch chain"
                        ),
                    };
                    tx.close_answered(session_id, attempt, gateway_id, &note, &next)?;
                }
            }
            Ok(None)
        }
        Err(e) => {
            tx.close_failed(session_id, attempt, gateway_id, &e.to_string(), &next)?;
            tx.gateway_unreached(gateway_id, &e.to_string())?;
            Ok(None)
        }
    }
}

/// A drop report from `gateway_id`'s batch chain (batch `seq`), already
/// checked as part of a verified batch: recorded, and the session's reset
/// re-run.
pub fn chain_drop_report(
    tx: &Tx<'_>,
    verifier: &dyn ReportVerifier,
    view: &DropReportView,
    seq: u64,
) -> Result<(), Error> {
    if tx.session(&view.session_id)?.is_none() {
        // An authority the store never knew (a static session, or one a
        // lost open made): nothing to confirm.
        return Ok(());
    }
    let asked = CloseReason::parse(&view.reason).unwrap_or(CloseReason::End);
    record_report(tx, verifier, view, asked, ("chain", Some(seq)))?;
    reevaluate(tx, &view.session_id)
}

/// A start report of `gateway_id` (instance `instance`, recorded with the
/// batch that carried it), from its batch chain: every CA of that gateway
/// made by a process that started before this one is gone. Which those are
/// is read off the chain itself: an instance whose start report came in an
/// earlier batch, or a CA recorded before instances were (no instance). A
/// CA of an instance whose start report has not come yet is newer, and is
/// left alone.
pub fn start_report(
    tx: &Tx<'_>,
    gateway_id: &str,
    instance: &str,
    report_digest: &str,
) -> Result<Vec<String>, Error> {
    // Older: the processes whose start reports came earlier in the chain.
    let reports = tx.start_reports(gateway_id)?;
    let this = reports
        .iter()
        .find(|r| r.instance == instance)
        .map_or(u64::MAX, |r| r.batch_seq);
    let older: BTreeSet<String> = reports
        .into_iter()
        .filter(|r| r.instance != instance && r.batch_seq < this)
        .map(|r| r.instance)
        .collect();
    let at = now();
    let mut touched = BTreeSet::new();
    for (session_id, ca) in tx.live_cas_of(gateway_id)? {
        let gone = match &ca.instance {
            None => true,
            Some(made) => older.contains(made),
        };
        if !gone {
            continue;
        }
        tx.mark_ca_destroyed(
            &session_id,
            ca.attempt,
            gateway_id,
            &ca.digest,
            CloseReason::GatewayRestarted,
            report_digest,
            &at,
        )?;
        tx.confirm_close(&session_id, ca.attempt, gateway_id, "start_report", &at)?;
        touched.insert(session_id);
    }
    for session_id in &touched {
        reevaluate(tx, session_id)?;
    }
    Ok(touched.into_iter().collect())
}

/// Re-run the reset of a session that is over (`stopping`,
/// `reset_incomplete`, `ended` or `failed` before its certificate): steps
/// 4 and 5 are recorded again from what is confirmed now, and the session
/// becomes `ended` (or `failed`) once all five are confirmed. A session
/// not over is left alone (the machine runs the reset only after an end),
/// and so is one whose certificate is issued.
pub fn reevaluate(tx: &Tx<'_>, session_id: &str) -> Result<(), Error> {
    let Some(session) = tx.session(session_id)? else {
        return Ok(());
    };
    let over = machine::next(Some(session.state), session.mode, Event::ResetPending).is_ok();
    if !over || tx.issued_certificate(session_id)?.is_some() {
        return Ok(());
    }
    reset(tx, &session)?;
    Ok(())
}

/// Run (or re-run) the sandbox reset of a session that is over, and set
/// its state as the machine decides from it: `ended` when all five steps
/// are confirmed (`failed` when no attempt of the session ever ran),
/// `reset_incomplete` otherwise.
pub fn reset(tx: &Tx<'_>, session: &Session) -> Result<(State, Vec<ResetStep>), Error> {
    let at = now();
    // Nothing of an ended session can be decided any more.
    tx.withdraw_proposals(&session.id, &at)?;
    let facts = Facts {
        cas: tx.cas(&session.id)?,
        reports: tx.drop_reports(&session.id)?,
        attempts: tx.attempts(&session.id)?,
        tasks: tx.close_tasks(&session.id)?,
    };
    // Steps 1–3 keep what was first recorded.
    let recorded = tx.reset_steps(&session.id)?;
    let mut steps: Vec<ResetStep> = RESET_STEPS[..3]
        .iter()
        .enumerate()
        .map(|(i, name)| {
            recorded
                .iter()
                .find(|s| usize::from(s.step) == i + 1)
                .cloned()
                .unwrap_or_else(|| {
                    ResetStep::new(
                        step_number(i),
                        (*name).to_owned(),
                        true,
                        stub_response(),
                        None,
                        at.clone(),
                    )
                })
        })
        .collect();
    // An open still in flight (the session ended while its members were
    // asked) may have made CAs and delivered attachments not recorded yet:
    // steps 4 and 5 wait for its answers, or for `serve` to give it up.
    let in_flight: Vec<String> = facts
        .attempts
        .iter()
        .filter(|a| a.ended_at.is_none())
        .map(|a| {
            format!(
                "attempt {}: its open is in flight since {}; waiting for the gateways' answers",
                a.n, a.started_at
            )
        })
        .collect();
    steps.push(facts.cas_destroyed(in_flight.clone(), &at));
    steps.push(facts.secrets_detached(in_flight, &at));
    for step in &steps {
        tx.insert_reset_step(&session.id, step)?;
    }
    // As recorded: each step with the outcomes before its latest.
    let steps = tx.reset_steps(&session.id)?;
    // A session none of whose attempts ever ran ends `failed`.
    let ran = facts.attempts.iter().any(|a| a.running_at.is_some());
    let event = match (steps.iter().all(|s| s.confirmed), ran) {
        (true, true) => Event::ResetConfirmed,
        (true, false) => Event::ResetConfirmedNeverRan,
        (false, _) => Event::ResetPending,
    };
    let next = machine::next(Some(session.state), session.mode, event)
        .map_err(|r| r.error(&session.id, Some(session.state)))?;
    tx.apply(&session.id, &next, &at)?;
    Ok((next.state(), steps))
}

/// What the store holds of a session's CAs, their reports, its attempts
/// and the closes owed: what steps 4 and 5 are judged on.
struct Facts {
    cas: Vec<CaEvent>,
    reports: Vec<DropReport>,
    attempts: Vec<Attempt>,
    tasks: Vec<CloseTask>,
}

impl Facts {
    /// The verified drop reports of `gateway` for `attempt`.
    fn counted(&self, attempt: u32, gateway: &str) -> Vec<&DropReport> {
        self.reports
            .iter()
            .filter(|r| r.attempt == attempt && r.gateway_id == gateway)
            .collect()
    }

    /// The close owed to `gateway` for `attempt`, as an error's words.
    fn owed(&self, attempt: u32, gateway: &str) -> Option<String> {
        self.tasks
            .iter()
            .find(|t| t.attempt == attempt && t.gateway_id == gateway && t.confirmed_at.is_none())
            .map(|t| {
                format!(
                    "close owed since {} ({} tries; last: {})",
                    t.created_at,
                    t.tries,
                    t.last_error.as_deref().unwrap_or("not asked yet")
                )
            })
    }

    /// Step 4: every CA made for the session destroyed, by a report that
    /// counted with the digest recorded when it was made, or by the start
    /// report of the gateway's next process.
    fn cas_destroyed(&self, in_flight: Vec<String>, at: &str) -> ResetStep {
        let (cas, counted, owed) = (&self.cas, |a, g| self.counted(a, g), |a, g| self.owed(a, g));
        let mut ca_errors = in_flight;
        let mut ca_items = Vec::new();
        for ca in cas {
            if let (Some(destroyed_at), Some(reason)) = (&ca.destroyed_at, ca.destroy_reason) {
                ca_items.push(json!({
                    "attempt": ca.attempt,
                    "gateway_id": ca.gateway_id,
                    "digest": ca.digest,
                    "destroyed_at": destroyed_at,
                    "reason": reason,
                    "report_digest": ca.destroy_report,
                }));
                continue;
            }
            let why = counted(ca.attempt, &ca.gateway_id)
                .into_iter()
                .rev()
                .find_map(|r| r.ca_error.clone())
                .or_else(|| owed(ca.attempt, &ca.gateway_id))
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
        gateway_step(
            3,
            json!({
                "check": "each CA made for the session is named by a verified drop report with the digest recorded when the gateway made it, or ended with the gateway process that made it (its successor's start report)",
                "cas": ca_items,
            }),
            ca_errors,
            at,
        )
    }

    /// Step 5: for every attempt and gateway, a report that counted named
    /// exactly the secrets attached at that attempt's open, or the process
    /// that held them is gone.
    fn secrets_detached(&self, in_flight: Vec<String>, at: &str) -> ResetStep {
        let (cas, attempts) = (&self.cas, &self.attempts);
        let (counted, owed) = (|a, g| self.counted(a, g), |a, g| self.owed(a, g));
        let mut secret_errors = in_flight;
        let mut secret_items = Vec::new();
        for attempt in attempts {
            let attached = attached_names(attempt);
            for ca in cas.iter().filter(|c| c.attempt == attempt.n) {
                let good = counted(attempt.n, &ca.gateway_id)
                    .into_iter()
                    .find(|r| r.secrets_error.is_none());
                match (good, restarted(ca)) {
                    (Some(r), _) => secret_items.push(json!({
                        "attempt": attempt.n,
                        "gateway_id": ca.gateway_id,
                        "attached": attached,
                        "reported": r.secrets,
                        "report_digest": r.report_digest,
                    })),
                    (None, true) => secret_items.push(json!({
                        "attempt": attempt.n,
                        "gateway_id": ca.gateway_id,
                        "attached": attached,
                        "gone_with_process": ca.instance,
                        "report_digest": ca.destroy_report,
                    })),
                    (None, false) => {
                        let why = counted(attempt.n, &ca.gateway_id)
                            .into_iter()
                            .rev()
                            .find_map(|r| r.secrets_error.clone())
                            .or_else(|| owed(attempt.n, &ca.gateway_id))
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
        gateway_step(
            4,
            json!({
                "check": "for each attempt and gateway, a verified drop report names exactly the secrets attached at the attempt's open, or the gateway process that held them is gone (its successor's start report)",
                "detached": secret_items,
            }),
            secret_errors,
            at,
        )
    }
}

/// Whether `ca` ended with the process that made it.
fn restarted(ca: &CaEvent) -> bool {
    ca.destroy_reason == Some(CloseReason::GatewayRestarted)
}

fn attached_names(attempt: &Attempt) -> Vec<&str> {
    let mut attached: Vec<&str> = attempt
        .attachments
        .iter()
        .map(|a| a.secret.as_str())
        .collect();
    attached.sort_unstable();
    attached.dedup();
    attached
}

fn gateway_step(
    index: usize,
    response: serde_json::Value,
    errors: Vec<String>,
    at: &str,
) -> ResetStep {
    ResetStep::new(
        step_number(index),
        RESET_STEPS[index].to_owned(),
        errors.is_empty(),
        response,
        (!errors.is_empty()).then(|| errors.join("; ")),
        at.to_owned(),
    )
}

/// Step numbers run from 1; there are five.
fn step_number(index: usize) -> u8 {
    u8::try_from(index + 1).unwrap_or(u8::MAX)
}

/// Why session `session`'s certificate cannot be issued now, if it
/// cannot: the session not over, a close unconfirmed, a member's batch
/// chain short of the end of its part ([`records_awaited`]), a reset step
/// unconfirmed. `None`: complete. What `certificate` prints as
/// `not_issued_because` and `sandbox status` as `certificate_waits_for`
/// (an issued certificate waits for nothing; this is not asked then).
pub fn certificate_waits_for(tx: &Tx<'_>, session: &Session) -> Result<Option<String>, Error> {
    if !session.state.is_over() {
        return Ok(Some(format!(
            "the session is {} and has not ended",
            session.state
        )));
    }
    if !session.state.is_reset() {
        return Ok(Some(format!(
            "the session is {}: a gateway has not confirmed its close",
            session.state
        )));
    }
    let missing = records_awaited(tx, &session.id)?;
    if !missing.is_empty() {
        return Ok(Some(format!("waiting for {}", missing.join("; "))));
    }
    let reset = tx.reset_steps(&session.id)?;
    let unconfirmed: Vec<&str> = reset
        .iter()
        .filter(|s| !s.confirmed)
        .map(|s| s.name.as_str())
        .collect();
    Ok(if reset.len() != 5 {
        Some("the reset has not recorded all five steps".into())
    } else if !unconfirmed.is_empty() {
        Some(format!(
            "reset steps not confirmed: {}",
            unconfirmed.join(", ")
        ))
    } else {
        None
    })
}

/// What a certificate of session `id` still waits for in the members'
/// batch chains, in words; empty once every record of the session from
/// every member that held its authority or forwarded its connections is
/// in (`docs/records.md`, "The certificate waits for every member"):
///
/// - **every member that held it**: for each CA made for the session, the
///   entry of that member's chain that ends the authority — its drop
///   report, placed after the records of the authority's connections, or
///   the start report of its next process, placed after the records of
///   the connections its crash cut. Batches are accepted in order, so the
///   member's every record of that authority is then in;
/// - **every member that forwarded for it** ([`handoffs_awaited`]): for
///   each connection a holder's record says came `via` that member, the
///   member's own record of the hand-off, or the start report of a process
///   of it that began after the connection was opened.
pub fn records_awaited(tx: &Tx<'_>, id: &str) -> Result<Vec<String>, Error> {
    let reports = tx.drop_reports(id)?;
    let mut missing = Vec::new();
    for ca in tx.cas(id)? {
        let in_chain = reports.iter().any(|r| {
            r.via == "chain"
                && r.attempt == ca.attempt
                && r.gateway_id == ca.gateway_id
                && r.ca_error.is_none()
        });
        if !restarted(&ca) && !in_chain {
            missing.push(format!(
                "gateway {}'s batches through the end of attempt {} (its drop report in its chain)",
                ca.gateway_id, ca.attempt
            ));
        }
    }
    missing.extend(handoffs_awaited(tx, id)?);
    Ok(missing)
}

/// The forwarders' part of [`records_awaited`].
///
/// A member that holds no authority for a live session hands the
/// session's connections, untouched, to a member that holds it. Each such
/// connection has two records: the holder's (`via` names the forwarder;
/// `source` is the session's own address, from the link's header), which
/// is the one the certificate counts, and the forwarder's hand-off
/// (verdict `allowed`, `forwarded_to` naming the holder, the same
/// `source`), which the certificate lists beside it. The forwarder writes
/// its hand-off when its side of the connection closes, which can be long
/// after the holder's — after a Stop the holder cuts at once, while the
/// forwarder first passes on to a slowly reading client what the holder
/// sent before the cut — so the holder's chain being complete says
/// nothing of the forwarder's.
///
/// So every holder's record `via` a forwarder waits for a hand-off record
/// of that forwarder to that holder from the same source (counted: one
/// each, so a source port used again is told apart by number). The wait
/// for a forwarder ends early only with its signed word that the process
/// that forwarded is gone: a start report of a process that began after
/// the latest of the connections still unmatched was opened. A start
/// report comes in the forwarder's chain after everything an earlier
/// process left on disk (the records recovery seals again and those cut by
/// the crash), so what has not come by then never will: a crash loses at
/// most the hand-offs not yet synced, which the holder's records cover. A
/// forwarder that is down, or whose chain is stuck, gives no such word,
/// and the certificate waits (it fails closed, as for a holder).
///
/// The start of a process is the forwarder's clock and a connection's
/// opening the holder's; the members of a pair keep their clocks in step,
/// and a restarted member forwards only once a renewal (seconds) has given
/// it its table. A clock far off shows as a longer wait (a start report
/// that seems older than the connections), or, the other way, as a
/// hand-off not listed; the connection itself is the holder's record
/// either way.
fn handoffs_awaited(tx: &Tx<'_>, id: &str) -> Result<Vec<String>, Error> {
    /// (forwarder, holder, source).
    type Key = (String, String, String);
    let text =
        |r: &serde_json::Value, k: &str| r.get(k).and_then(|v| v.as_str()).map(str::to_owned);
    let mut via: BTreeMap<Key, Vec<Option<SystemTime>>> = BTreeMap::new();
    let mut handed: BTreeMap<Key, usize> = BTreeMap::new();
    for r in tx.connection_records(id)? {
        let rec = &r.record;
        if text(rec, "kind").as_deref() == Some("dns") {
            continue;
        }
        let source = text(rec, "source").unwrap_or_default();
        if let Some(forwarder) = text(rec, "via") {
            let opened = text(rec, "opened_at").and_then(|t| humantime::parse_rfc3339(&t).ok());
            via.entry((forwarder, r.gateway_id.clone(), source))
                .or_default()
                .push(opened);
        } else if let (Some(holder), Some("allowed")) =
            (text(rec, "forwarded_to"), text(rec, "verdict").as_deref())
        {
            *handed
                .entry((r.gateway_id.clone(), holder, source))
                .or_default() += 1;
        }
    }
    /// What one forwarder still owes: how many hand-offs, to which
    /// holders, and the latest opening among them (`None`: one whose
    /// opening does not parse, which no start report can be known to
    /// follow).
    struct Owed {
        count: usize,
        holders: BTreeSet<String>,
        latest: Option<SystemTime>,
    }
    let mut owed: BTreeMap<String, Owed> = BTreeMap::new();
    for ((forwarder, holder, source), openings) in via {
        let have = handed
            .get(&(forwarder.clone(), holder.clone(), source))
            .copied()
            .unwrap_or(0);
        if openings.len() <= have {
            continue;
        }
        let o = owed.entry(forwarder).or_insert_with(|| Owed {
            count: 0,
            holders: BTreeSet::new(),
            latest: Some(SystemTime::UNIX_EPOCH),
        });
        o.count += openings.len() - have;
        o.holders.insert(holder);
        for opened in openings {
            o.latest = match (o.latest, opened) {
                (Some(a), Some(b)) => Some(a.max(b)),
                _ => None,
            };
        }
    }
    let mut missing = Vec::new();
    for (forwarder, o) in owed {
        let restarted_since = match o.latest {
            None => false,
            Some(latest) => tx.start_reports(&forwarder)?.iter().any(|r| {
                humantime::parse_rfc3339(&r.started_at).is_ok_and(|started| started > latest)
            }),
        };
        if restarted_since {
            continue;
        }
        let holders: Vec<&str> = o.holders.iter().map(String::as_str).collect();
        missing.push(format!(
            "gateway {forwarder}'s hand-off records of {} it forwarded to {} (the holder's records name it in `via`), or the start report of a process of it started since",
            plural(o.count, "connection"),
            holders.join(" and ")
        ));
    }
    Ok(missing)
}

/// `n` and `noun`, in the plural unless `n` is 1.
fn plural(n: usize, noun: &str) -> String {
    if n == 1 {
        format!("1 {noun}")
    } else {
        format!("{n} {noun}s")
    }
}

/// Checks a drop report's Ed25519 signature under the gateway's registered
/// key (talos-certs `verify_drop_report`, which also insists on the
/// canonical encoding), and that the signed report says exactly what the
/// view's fields say.
///
/// `report.signed` is the signed envelope as JSON (talos-certs `Signed`),
/// as [`GrpcLink`] makes it.
#[derive(Clone, Copy, Debug, Default)]
pub struct SignatureVerifier;

impl ReportVerifier for SignatureVerifier {
    fn verify(&self, report: &DropReportView, gateway_key: Option<&str>) -> Result<(), String> {
        let key_hex = gateway_key
            .ok_or_else(|| format!("gateway {} is not registered", report.gateway_id))?;
        let key = ed25519_key(key_hex).ok_or_else(|| {
            format!(
                "the registered key of gateway {} is not an Ed25519 public key",
                report.gateway_id
            )
        })?;
        let signed: talos_certs::Signed = serde_json::from_slice(&report.signed)
            .map_err(|e| format!("the signed report does not parse: {e}"))?;
        let signed_report =
            talos_certs::verify_drop_report(&key, &signed).map_err(|e| e.to_string())?;
        let mut view_secrets = report.secrets.clone();
        view_secrets.sort();
        view_secrets.dedup();
        let same = signed_report.gateway_id == report.gateway_id
            && signed_report.instance == report.instance
            && signed_report.session_id == report.session_id
            && signed_report.attempt == report.attempt
            && signed_report.reason.as_str() == report.reason
            && signed_report.ca_digest == report.ca_digest
            && signed_report.secrets == view_secrets;
        if same {
            Ok(())
        } else {
            Err("the signed report does not say what its fields say".into())
        }
    }

    fn describe(&self) -> &'static str {
        "Ed25519 signature under the gateway's registered key (talos-certs verify_drop_report); fields as signed"
    }
}
