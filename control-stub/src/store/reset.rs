//! What the reset rests on: the CAs the gateways made for each attempt,
//! the drop reports that say they were destroyed, the closes still owed,
//! and the reset's steps.

use serde::Serialize;

use super::db::Tx;
use super::value::{json_col, params, parse_word, OptionalExtension, Row};
use crate::error::Error;
use crate::model::CloseReason;

/// A CA a gateway made for an attempt, and its destruction.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct CaEvent {
    pub attempt: u32,
    pub gateway_id: String,
    pub digest: String,
    #[serde(skip)]
    pub cert_pem: String,
    pub made_at: String,
    /// The gateway process that made it (its `OpenSession` reply said).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub instance: Option<String>,
    /// Set when a verified drop report named this digest, or a start
    /// report said the process that made it is gone.
    pub destroyed_at: Option<String>,
    pub destroy_reason: Option<CloseReason>,
    /// The digest of the signed report that confirmed it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub destroy_report: Option<String>,
}

/// A drop report as received and checked.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct DropReport {
    /// The attempt whose authority was dropped.
    pub attempt: u32,
    pub gateway_id: String,
    pub reason: CloseReason,
    pub ca_digest: String,
    pub secrets: Vec<String>,
    /// The gateway process that held the authority.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub instance: Option<String>,
    /// How it came: `reply` (a close's answer) or `chain` (an entry of the
    /// gateway's batch chain, in batch `batch_seq`).
    pub via: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub batch_seq: Option<u64>,
    /// SHA-384 of the signed bytes, to name the report.
    pub report_digest: String,
    pub received_at: String,
    /// What checked the signature.
    pub verifier: String,
    /// Why the report does not confirm the CA's destruction, if it does not.
    pub ca_error: Option<String>,
    /// Why the report does not confirm the secrets' detachment, if it does not.
    pub secrets_error: Option<String>,
}

/// One recorded reset step: its latest outcome, and every outcome
/// recorded before it, oldest first (none when it was recorded once).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ResetStep {
    pub step: u8,
    pub name: String,
    pub confirmed: bool,
    pub response: serde_json::Value,
    pub error: Option<String>,
    pub at: String,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub earlier: Vec<StepOutcome>,
}

/// An outcome of a reset step that a later one followed: kept as it was
/// recorded, never replaced.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct StepOutcome {
    pub confirmed: bool,
    pub response: serde_json::Value,
    pub error: Option<String>,
    pub at: String,
}

impl ResetStep {
    /// A step recorded now, with no earlier outcome.
    pub fn new(
        step: u8,
        name: String,
        confirmed: bool,
        response: serde_json::Value,
        error: Option<String>,
        at: String,
    ) -> ResetStep {
        ResetStep {
            step,
            name,
            confirmed,
            response,
            error,
            at,
            earlier: Vec::new(),
        }
    }
}

impl Tx<'_> {
    pub fn insert_ca(&self, session_id: &str, ca: &CaEvent) -> Result<(), Error> {
        self.conn.execute(
            "INSERT INTO ca_events (session_id, attempt, gateway_id, digest, cert_pem, made_at,
                                    destroyed_at, destroy_reason, instance, destroy_report)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)",
            params![
                session_id,
                ca.attempt,
                ca.gateway_id,
                ca.digest,
                ca.cert_pem,
                ca.made_at,
                ca.destroyed_at,
                ca.destroy_reason.map(|r| r.as_str()),
                ca.instance,
                ca.destroy_report,
            ],
        )?;
        Ok(())
    }

    /// Every CA made for the session, by attempt then gateway.
    pub fn cas(&self, session_id: &str) -> Result<Vec<CaEvent>, Error> {
        let mut stmt = self.conn.prepare(&format!(
            "SELECT {CA_COLUMNS} FROM ca_events WHERE session_id = ?1 ORDER BY attempt, gateway_id"
        ))?;
        let rows = stmt.query_map(params![session_id], ca_row)?;
        rows.collect::<Result<Vec<_>, _>>()
    }

    /// Every CA made for a running session, with its session, in order.
    pub fn cas_of_running(&self) -> Result<Vec<(String, CaEvent)>, Error> {
        let cols: Vec<String> = CA_COLUMNS
            .split(',')
            .map(|c| format!("c.{}", c.trim()))
            .collect();
        let mut stmt = self.conn.prepare(&format!(
            "SELECT c.session_id, {} FROM ca_events c JOIN sessions s ON s.id = c.session_id
             WHERE s.state = 'running' ORDER BY c.session_id, c.attempt, c.gateway_id",
            cols.join(", ")
        ))?;
        let rows = stmt.query_map([], |r| Ok((r.get(0)?, ca_row_at(r, 1)?)))?;
        rows.collect::<Result<Vec<_>, _>>()
    }

    /// Every CA of gateway `gateway_id` not yet destroyed, with its
    /// session: what a start report of that gateway may confirm.
    pub fn live_cas_of(&self, gateway_id: &str) -> Result<Vec<(String, CaEvent)>, Error> {
        let mut stmt = self.conn.prepare(&format!(
            "SELECT session_id, {CA_COLUMNS} FROM ca_events
             WHERE gateway_id = ?1 AND destroyed_at IS NULL ORDER BY session_id, attempt"
        ))?;
        let rows = stmt.query_map(params![gateway_id], |r| {
            Ok((r.get::<_, String>(0)?, ca_row_at(r, 1)?))
        })?;
        rows.collect::<Result<Vec<_>, _>>()
    }

    /// Record that a verified report named the CA `digest` of this attempt
    /// and gateway as destroyed.
    #[allow(clippy::too_many_arguments)]
    pub fn mark_ca_destroyed(
        &self,
        session_id: &str,
        attempt: u32,
        gateway_id: &str,
        digest: &str,
        reason: CloseReason,
        report_digest: &str,
        at: &str,
    ) -> Result<bool, Error> {
        let n = self.conn.execute(
            "UPDATE ca_events SET destroyed_at = ?5, destroy_reason = ?6, destroy_report = ?7
             WHERE session_id = ?1 AND attempt = ?2 AND gateway_id = ?3 AND digest = ?4
               AND destroyed_at IS NULL",
            params![
                session_id,
                attempt,
                gateway_id,
                digest,
                at,
                reason.as_str(),
                report_digest
            ],
        )?;
        Ok(n > 0)
    }

    pub fn insert_drop_report(
        &self,
        session_id: &str,
        report: &DropReport,
        signed: &[u8],
    ) -> Result<(), Error> {
        self.conn.execute(
            "INSERT INTO drop_reports (session_id, attempt, gateway_id, reason, ca_digest, secrets,
                                       signed, received_at, verifier, ca_error, secrets_error,
                                       instance, via, batch_seq)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14)",
            params![
                session_id,
                report.attempt,
                report.gateway_id,
                report.reason.as_str(),
                report.ca_digest,
                serde_json::to_string(&report.secrets)?,
                signed,
                report.received_at,
                report.verifier,
                report.ca_error,
                report.secrets_error,
                report.instance,
                report.via,
                report.batch_seq.and_then(|n| i64::try_from(n).ok()),
            ],
        )?;
        Ok(())
    }

    /// Every drop report received for the session, in order of receipt.
    pub fn drop_reports(&self, session_id: &str) -> Result<Vec<DropReport>, Error> {
        let mut stmt = self.conn.prepare(
            "SELECT attempt, gateway_id, reason, ca_digest, secrets, signed, received_at,
                    verifier, ca_error, secrets_error, instance, via, batch_seq
             FROM drop_reports WHERE session_id = ?1 ORDER BY rowid",
        )?;
        let rows = stmt.query_map(params![session_id], |r| {
            Ok(DropReport {
                attempt: r.get(0)?,
                gateway_id: r.get(1)?,
                reason: parse_word(2, r.get(2)?, CloseReason::parse)?,
                ca_digest: r.get(3)?,
                secrets: json_col(4, r.get(4)?)?,
                report_digest: talos_certs::sha384_hex(&r.get::<_, Vec<u8>>(5)?),
                received_at: r.get(6)?,
                verifier: r.get(7)?,
                ca_error: r.get(8)?,
                secrets_error: r.get(9)?,
                instance: r.get(10)?,
                via: r.get(11)?,
                batch_seq: r
                    .get::<_, Option<i64>>(12)?
                    .and_then(|n| u64::try_from(n).ok()),
            })
        })?;
        rows.collect::<Result<Vec<_>, _>>()
    }

    /// Record an outcome of a reset step. One that says what the step's
    /// latest outcome says adds nothing; another is added beside the
    /// earlier ones, which stay as they were (steps 4 and 5 are recorded
    /// again as gateways confirm their closes: the first, unconfirmed
    /// outcome is kept beside the confirmation).
    pub fn insert_reset_step(&self, session_id: &str, step: &ResetStep) -> Result<(), Error> {
        let latest = self
            .conn
            .query_row(
                "SELECT confirmed, response, error FROM reset_steps
                 WHERE session_id = ?1 AND step = ?2 ORDER BY n DESC LIMIT 1",
                params![session_id, step.step],
                |r| {
                    Ok((
                        r.get::<_, bool>(0)?,
                        json_col::<serde_json::Value>(1, r.get(1)?)?,
                        r.get::<_, Option<String>>(2)?,
                    ))
                },
            )
            .optional()?;
        if latest.is_some_and(|(confirmed, response, error)| {
            confirmed == step.confirmed && response == step.response && error == step.error
        }) {
            return Ok(());
        }
        self.conn.execute(
            "INSERT INTO reset_steps (session_id, step, n, name, confirmed, response, error, at)
             VALUES (?1, ?2,
                     (SELECT coalesce(max(n), 0) + 1 FROM reset_steps
                      WHERE session_id = ?1 AND step = ?2),
                     ?3, ?4, ?5, ?6, ?7)",
            params![
                session_id,
                step.step,
                step.name,
                step.confirmed,
                serde_json::to_string(&step.response)?,
                step.error,
                step.at,
            ],
        )?;
        Ok(())
    }

    /// The session's reset steps, in order (none before it ends): each
    /// with its latest outcome and the ones before it.
    pub fn reset_steps(&self, session_id: &str) -> Result<Vec<ResetStep>, Error> {
        let mut stmt = self.conn.prepare(
            "SELECT step, name, confirmed, response, error, at
             FROM reset_steps WHERE session_id = ?1 ORDER BY step, n",
        )?;
        let rows = stmt.query_map(params![session_id], |r| {
            Ok(ResetStep::new(
                r.get(0)?,
                r.get(1)?,
                r.get(2)?,
                json_col(3, r.get(3)?)?,
                r.get(4)?,
                r.get(5)?,
            ))
        })?;
        let mut steps: Vec<ResetStep> = Vec::new();
        for row in rows {
            let row = row?;
            match steps.last_mut() {
                Some(last) if last.step == row.step => {
                    let before = std::mem::replace(last, row);
                    let mut earlier = before.earlier;
                    earlier.push(StepOutcome {
                        confirmed: before.confirmed,
                        response: before.response,
                        error: before.error,
                        at: before.at,
                    });
                    last.earlier = earlier;
                }
                _ => steps.push(row),
            }
        }
        Ok(steps)
    }
}

impl Tx<'_> {
    /// Every running session nothing serves: its latest attempt has not
    /// ended, made CAs, and every one of them is destroyed (verified
    /// reports say so: a lapsed lease, the end of the process that held
    /// it). Each with the destroy reasons, sorted, once each. One query,
    /// whatever the number of sessions.
    pub fn unserved_sessions(&self) -> Result<Vec<(String, Vec<String>)>, Error> {
        let mut stmt = self.conn.prepare(&format!(
            "SELECT s.id, {}
             FROM sessions s
             JOIN attempts a ON a.session_id = s.id
                 AND a.n = (SELECT max(n) FROM attempts WHERE session_id = s.id)
             JOIN ca_events c ON c.session_id = s.id AND c.attempt = a.n
             WHERE s.state = 'running' AND a.ended_at IS NULL
             GROUP BY s.id
             HAVING count(*) = count(c.destroyed_at)
             ORDER BY s.id",
            self.conn
                .dialect()
                .string_agg("coalesce(c.destroy_reason, '')", ",")
        ))?;
        let rows = stmt.query_map([], |r| {
            let id: String = r.get(0)?;
            let joined: String = r.get(1)?;
            let mut reasons: Vec<String> = joined
                .split(',')
                .filter(|r| !r.is_empty())
                .map(str::to_owned)
                .collect();
            reasons.sort_unstable();
            reasons.dedup();
            Ok((id, reasons))
        })?;
        rows.collect::<Result<Vec<_>, _>>()
    }
}

/// The columns of a CA row, in [`ca_row`]'s order.
const CA_COLUMNS: &str = "attempt, gateway_id, digest, cert_pem, made_at, destroyed_at,
    destroy_reason, instance, destroy_report";

fn ca_row(r: &Row) -> Result<CaEvent, Error> {
    ca_row_at(r, 0)
}

fn ca_row_at(r: &Row, at: usize) -> Result<CaEvent, Error> {
    Ok(CaEvent {
        attempt: r.get(at)?,
        gateway_id: r.get(at + 1)?,
        digest: r.get(at + 2)?,
        cert_pem: r.get(at + 3)?,
        made_at: r.get(at + 4)?,
        destroyed_at: r.get(at + 5)?,
        destroy_reason: r
            .get::<_, Option<String>>(at + 6)?
            .map(|t| parse_word(at + 6, t, CloseReason::parse))
            .transpose()?,
        instance: r.get(at + 7)?,
        destroy_report: r.get(at + 8)?,
    })
}

/// A close the control stub owes a gateway: asked until the gateway's
/// signed word (a drop report, in a reply or in its batch chain, or its
/// successor's start report) confirms that the authority is gone.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct CloseTask {
    pub attempt: u32,
    pub gateway_id: String,
    pub reason: CloseReason,
    pub created_at: String,
    /// Calls made so far.
    pub tries: u32,
    /// When the next call is due (while not confirmed).
    pub next_at: String,
    /// What the last call met.
    pub last_error: Option<String>,
    pub confirmed_at: Option<String>,
    /// What confirmed it: `reply`, `chain` or `start_report`.
    pub confirmed_by: Option<String>,
}

/// A close still owed, with its session: what the retry loop works on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DueClose {
    pub session_id: String,
    pub task: CloseTask,
}

const CLOSE_COLUMNS: &str = "attempt, gateway_id, reason, created_at, tries, next_at, last_error,
    confirmed_at, confirmed_by";

fn close_row_at(r: &Row, at: usize) -> Result<CloseTask, Error> {
    Ok(CloseTask {
        attempt: r.get(at)?,
        gateway_id: r.get(at + 1)?,
        reason: parse_word(at + 2, r.get(at + 2)?, CloseReason::parse)?,
        created_at: r.get(at + 3)?,
        tries: r.get(at + 4)?,
        next_at: r.get(at + 5)?,
        last_error: r.get(at + 6)?,
        confirmed_at: r.get(at + 7)?,
        confirmed_by: r.get(at + 8)?,
    })
}

impl Tx<'_> {
    /// Owe gateway `gateway_id` a close of `attempt` (nothing changes if
    /// one is owed already); due at once.
    pub fn insert_close_task(
        &self,
        session_id: &str,
        attempt: u32,
        gateway_id: &str,
        reason: CloseReason,
        at: &str,
    ) -> Result<(), Error> {
        self.conn.execute(
            "INSERT INTO close_tasks (session_id, attempt, gateway_id, reason,
                                                created_at, next_at)
             VALUES (?1, ?2, ?3, ?4, ?5, ?5) ON CONFLICT DO NOTHING",
            params![session_id, attempt, gateway_id, reason.as_str(), at],
        )?;
        Ok(())
    }

    /// Owe gateway `gateway_id` a close of `attempt` for a CA recorded
    /// only now (an open's answers that came after its session ended or
    /// its open was given up): due at once, and owed again if a close of
    /// that attempt was settled before the CA was known (the gateway then
    /// answers with the drop report that destroys it).
    pub fn owe_close_again(
        &self,
        session_id: &str,
        attempt: u32,
        gateway_id: &str,
        reason: CloseReason,
        at: &str,
    ) -> Result<(), Error> {
        self.conn.execute(
            "INSERT INTO close_tasks (session_id, attempt, gateway_id, reason, created_at,
                                      next_at)
             VALUES (?1, ?2, ?3, ?4, ?5, ?5)
             ON CONFLICT (session_id, attempt, gateway_id) DO UPDATE
                 SET next_at = excluded.next_at, confirmed_at = NULL, confirmed_by = NULL",
            params![session_id, attempt, gateway_id, reason.as_str(), at],
        )?;
        Ok(())
    }

    /// The session's closes, owed and confirmed.
    pub fn close_tasks(&self, session_id: &str) -> Result<Vec<CloseTask>, Error> {
        let mut stmt = self.conn.prepare(&format!(
            "SELECT {CLOSE_COLUMNS} FROM close_tasks WHERE session_id = ?1
             ORDER BY attempt, gateway_id"
        ))?;
        let rows = stmt.query_map(params![session_id], |r| close_row_at(r, 0))?;
        rows.collect::<Result<Vec<_>, _>>()
    }

    /// Closes still owed whose next call is due at `now`.
    pub fn due_closes(&self, now: &str) -> Result<Vec<DueClose>, Error> {
        let mut stmt = self.conn.prepare(&format!(
            "SELECT session_id, {CLOSE_COLUMNS} FROM close_tasks
             WHERE confirmed_at IS NULL AND next_at <= ?1 ORDER BY next_at"
        ))?;
        let rows = stmt.query_map(params![now], |r| {
            Ok(DueClose {
                session_id: r.get(0)?,
                task: close_row_at(r, 1)?,
            })
        })?;
        rows.collect::<Result<Vec<_>, _>>()
    }

    /// How many closes are still owed.
    pub fn closes_owed(&self) -> Result<u64, Error> {
        let n: i64 = self.conn.query_row(
            "SELECT count(*) FROM close_tasks WHERE confirmed_at IS NULL",
            [],
            |r| r.get(0),
        )?;
        Ok(u64::try_from(n).unwrap_or(0))
    }

    /// A call for an owed close failed: count it, say why, and when to try
    /// again.
    pub fn close_failed(
        &self,
        session_id: &str,
        attempt: u32,
        gateway_id: &str,
        error: &str,
        next_at: &str,
    ) -> Result<(), Error> {
        self.conn.execute(
            "UPDATE close_tasks SET tries = tries + 1, last_error = ?4, next_at = ?5
             WHERE session_id = ?1 AND attempt = ?2 AND gateway_id = ?3
               AND confirmed_at IS NULL",
            params![session_id, attempt, gateway_id, error, next_at],
        )?;
        Ok(())
    }

    /// A call for an owed close was answered, but the answer does not
    /// confirm yet (the gateway restarted and its start report is still on
    /// its way, say): count it and wait for the confirmation.
    pub fn close_answered(
        &self,
        session_id: &str,
        attempt: u32,
        gateway_id: &str,
        note: &str,
        next_at: &str,
    ) -> Result<(), Error> {
        self.close_failed(session_id, attempt, gateway_id, note, next_at)
    }

    /// Confirm the owed close of `attempt` on `gateway_id` (`by`: `reply`,
    /// `chain` or `start_report`). Returns whether one was owed.
    pub fn confirm_close(
        &self,
        session_id: &str,
        attempt: u32,
        gateway_id: &str,
        by: &str,
        at: &str,
    ) -> Result<bool, Error> {
        let n = self.conn.execute(
            "UPDATE close_tasks SET confirmed_at = ?4, confirmed_by = ?5, last_error = NULL
             WHERE session_id = ?1 AND attempt = ?2 AND gateway_id = ?3
               AND confirmed_at IS NULL",
            params![session_id, attempt, gateway_id, at, by],
        )?;
        Ok(n > 0)
    }
}
