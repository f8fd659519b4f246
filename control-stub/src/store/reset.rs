//! What the reset rests on: the CAs the gateways made for each attempt,
//! the drop reports that say they were destroyed, and the reset's steps.

use rusqlite::params;
use serde::Serialize;

use super::db::{json_col, parse_word, Tx};
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
    /// Set when a verified drop report named this digest.
    pub destroyed_at: Option<String>,
    pub destroy_reason: Option<CloseReason>,
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

/// One recorded reset step.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ResetStep {
    pub step: u8,
    pub name: String,
    pub confirmed: bool,
    pub response: serde_json::Value,
    pub error: Option<String>,
    pub at: String,
}

impl Tx<'_> {
    pub fn insert_ca(&self, session_id: &str, ca: &CaEvent) -> Result<(), Error> {
        self.conn.execute(
            "INSERT INTO ca_events (session_id, attempt, gateway_id, digest, cert_pem, made_at,
                                    destroyed_at, destroy_reason)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
            params![
                session_id,
                ca.attempt,
                ca.gateway_id,
                ca.digest,
                ca.cert_pem,
                ca.made_at,
                ca.destroyed_at,
                ca.destroy_reason.map(|r| r.as_str()),
            ],
        )?;
        Ok(())
    }

    /// Every CA made for the session, by attempt then gateway.
    pub fn cas(&self, session_id: &str) -> Result<Vec<CaEvent>, Error> {
        let mut stmt = self.conn.prepare(
            "SELECT attempt, gateway_id, digest, cert_pem, made_at, destroyed_at, destroy_reason
             FROM ca_events WHERE session_id = ?1 ORDER BY attempt, gateway_id",
        )?;
        let rows = stmt.query_map(params![session_id], |r| {
            Ok(CaEvent {
                attempt: r.get(0)?,
                gateway_id: r.get(1)?,
                digest: r.get(2)?,
                cert_pem: r.get(3)?,
                made_at: r.get(4)?,
                destroyed_at: r.get(5)?,
                destroy_reason: r
                    .get::<_, Option<String>>(6)?
                    .map(|t| parse_word(6, t, CloseReason::parse))
                    .transpose()?,
            })
        })?;
        Ok(rows.collect::<Result<Vec<_>, _>>()?)
    }

    /// Record that a verified report named the CA `digest` of this attempt
    /// and gateway as destroyed.
    pub fn mark_ca_destroyed(
        &self,
        session_id: &str,
        attempt: u32,
        gateway_id: &str,
        digest: &str,
        reason: CloseReason,
        at: &str,
    ) -> Result<(), Error> {
        self.conn.execute(
            "UPDATE ca_events SET destroyed_at = ?5, destroy_reason = ?6
             WHERE session_id = ?1 AND attempt = ?2 AND gateway_id = ?3 AND digest = ?4
               AND destroyed_at IS NULL",
            params![session_id, attempt, gateway_id, digest, at, reason.as_str()],
        )?;
        Ok(())
    }

    pub fn insert_drop_report(
        &self,
        session_id: &str,
        report: &DropReport,
        signed: &[u8],
    ) -> Result<(), Error> {
        self.conn.execute(
            "INSERT INTO drop_reports (session_id, attempt, gateway_id, reason, ca_digest, secrets,
                                       signed, received_at, verifier, ca_error, secrets_error)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)",
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
            ],
        )?;
        Ok(())
    }

    /// Every drop report received for the session, in order of receipt.
    pub fn drop_reports(&self, session_id: &str) -> Result<Vec<DropReport>, Error> {
        let mut stmt = self.conn.prepare(
            "SELECT attempt, gateway_id, reason, ca_digest, secrets, signed, received_at,
                    verifier, ca_error, secrets_error
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
            })
        })?;
        Ok(rows.collect::<Result<Vec<_>, _>>()?)
    }

    pub fn insert_reset_step(&self, session_id: &str, step: &ResetStep) -> Result<(), Error> {
        self.conn.execute(
            "INSERT INTO reset_steps (session_id, step, name, confirmed, response, error, at)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
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

    /// The session's reset steps, in order (none before it ends).
    pub fn reset_steps(&self, session_id: &str) -> Result<Vec<ResetStep>, Error> {
        let mut stmt = self.conn.prepare(
            "SELECT step, name, confirmed, response, error, at
             FROM reset_steps WHERE session_id = ?1 ORDER BY step",
        )?;
        let rows = stmt.query_map(params![session_id], |r| {
            Ok(ResetStep {
                step: r.get(0)?,
                name: r.get(1)?,
                confirmed: r.get(2)?,
                response: json_col(3, r.get(3)?)?,
                error: r.get(4)?,
                at: r.get(5)?,
            })
        })?;
        Ok(rows.collect::<Result<Vec<_>, _>>()?)
    }
}
