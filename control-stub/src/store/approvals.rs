//! The approval relay's tables: the approvals API's approvers and the
//! gateways' proposals with their decisions.

use serde::Serialize;

use super::db::{now, Store, Tx};
use super::value::{json_col, params, parse_word, OptionalExtension, Row};
use crate::error::Error;
use crate::model::ProposalState;

/// An approver as `approvers list` shows them: no token, no hash.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ApproverInfo {
    pub name: String,
    pub created_at: String,
}

/// A proposal as the relay keeps it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ProposalRecord {
    pub proposal_id: String,
    pub gateway_id: String,
    pub session_id: String,
    pub attempt: u32,
    pub rule: String,
    /// The fields as the gateway sent them (talos-certs `Proposal`).
    pub fields: talos_certs::Proposal,
    pub sentence: String,
    pub digest: String,
    pub state: ProposalState,
    pub approver: Option<String>,
    /// When it left `pending`: decided, withdrawn or found expired.
    pub decided_at: Option<String>,
    pub created_at: String,
    pub expires_at: String,
    pub received_at: String,
    /// The signed decision delivered to the gateway (talos-certs `Signed`).
    pub decision: Option<serde_json::Value>,
    /// The gateway's answer to the decision: `released` or `refused`.
    pub outcome: Option<String>,
}

impl Store {
    /// Give approver `name` a token, stored only as its SHA-256 (hex).
    pub fn approver_add(&mut self, name: &str, token_sha256: &str) -> Result<(), Error> {
        let name = crate::lock::approver(name)?;
        self.write(|tx| {
            let known: Option<String> = tx
                .conn
                .query_row(
                    "SELECT name FROM approvers WHERE name = ?1",
                    params![name],
                    |r| r.get(0),
                )
                .optional()?;
            if known.is_some() {
                return Err(Error::ApproverExists { name: name.clone() });
            }
            tx.conn.execute(
                "INSERT INTO approvers (name, token_sha256, created_at) VALUES (?1, ?2, ?3)",
                params![name, token_sha256, now()],
            )?;
            Ok(())
        })
    }

    /// The approvers with a token: names and times, never the hashes.
    pub fn approver_list(&self) -> Result<Vec<ApproverInfo>, Error> {
        self.read(|tx| {
            let mut stmt = tx
                .conn
                .prepare("SELECT name, created_at FROM approvers ORDER BY name")?;
            let rows = stmt.query_map([], |r| {
                Ok(ApproverInfo {
                    name: r.get(0)?,
                    created_at: r.get(1)?,
                })
            })?;
            rows.collect::<Result<Vec<_>, _>>()
        })
    }

    /// Remove approver `name`'s token: the API no longer knows them.
    pub fn approver_remove(&mut self, name: &str) -> Result<(), Error> {
        self.write(|tx| {
            let n = tx
                .conn
                .execute("DELETE FROM approvers WHERE name = ?1", params![name])?;
            if n == 0 {
                return Err(Error::ApproverNotFound {
                    name: name.chars().take(100).collect(),
                });
            }
            Ok(())
        })
    }
}

impl Tx<'_> {
    pub fn insert_proposal(&self, p: &ProposalRecord) -> Result<(), Error> {
        self.conn.execute(
            &format!(
                "INSERT INTO proposals ({PROPOSAL_COLUMNS})
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16)"
            ),
            params![
                p.proposal_id,
                p.gateway_id,
                p.session_id,
                p.attempt,
                p.rule,
                serde_json::to_string(&p.fields)?,
                p.sentence,
                p.digest,
                p.state.as_str(),
                p.approver,
                p.decided_at,
                p.created_at,
                p.expires_at,
                p.received_at,
                p.decision.as_ref().map(serde_json::to_string).transpose()?,
                p.outcome,
            ],
        )?;
        Ok(())
    }

    /// Proposal `id`, if the relay has it.
    pub fn proposal(&self, id: &str) -> Result<Option<ProposalRecord>, Error> {
        self.conn
            .query_row(
                &format!("SELECT {PROPOSAL_COLUMNS} FROM proposals WHERE proposal_id = ?1"),
                params![id],
                proposal_row,
            )
            .optional()
    }

    /// Proposals in order of receipt: of one session, or all; in one
    /// state, or any.
    pub fn proposals(
        &self,
        session_id: Option<&str>,
        state: Option<ProposalState>,
    ) -> Result<Vec<ProposalRecord>, Error> {
        let mut stmt = self.conn.prepare(&format!(
            "SELECT {PROPOSAL_COLUMNS} FROM proposals
             WHERE (CAST(?1 AS TEXT) IS NULL OR session_id = ?1)
               AND (CAST(?2 AS TEXT) IS NULL OR state = ?2)
             ORDER BY rowid"
        ))?;
        let rows = stmt.query_map(
            params![session_id, state.map(ProposalState::as_str)],
            proposal_row,
        )?;
        rows.collect::<Result<Vec<_>, _>>()
    }

    /// Move a pending proposal to `state` (withdrawn or expired) at `at`.
    pub fn close_proposal(&self, id: &str, state: ProposalState, at: &str) -> Result<(), Error> {
        self.conn.execute(
            "UPDATE proposals SET state = ?2, decided_at = ?3
             WHERE proposal_id = ?1 AND state = 'pending'",
            params![id, state.as_str(), at],
        )?;
        Ok(())
    }

    /// Record a delivered decision on a pending proposal.
    pub fn decide_proposal(
        &self,
        id: &str,
        state: ProposalState,
        approver: &str,
        at: &str,
        decision: &serde_json::Value,
        outcome: &str,
    ) -> Result<(), Error> {
        self.conn.execute(
            "UPDATE proposals SET state = ?2, approver = ?3, decided_at = ?4, decision = ?5,
                                  outcome = ?6
             WHERE proposal_id = ?1 AND state = 'pending'",
            params![
                id,
                state.as_str(),
                approver,
                at,
                serde_json::to_string(decision)?,
                outcome
            ],
        )?;
        Ok(())
    }

    /// Withdraw every pending proposal of the session (it paused, was
    /// interrupted or ended); returns how many.
    pub fn withdraw_proposals(&self, session_id: &str, at: &str) -> Result<usize, Error> {
        self.conn.execute(
            "UPDATE proposals SET state = 'withdrawn', decided_at = ?2
             WHERE session_id = ?1 AND state = 'pending'",
            params![session_id, at],
        )
    }

    /// The approver whose token has this SHA-256 (hex), if any.
    pub fn approver_by_token(&self, token_sha256: &str) -> Result<Option<String>, Error> {
        self.conn
            .query_row(
                "SELECT name FROM approvers WHERE token_sha256 = ?1",
                params![token_sha256],
                |r| r.get(0),
            )
            .optional()
    }
}

const PROPOSAL_COLUMNS: &str =
    "proposal_id, gateway_id, session_id, attempt, rule, fields, sentence,
     digest, state, approver, decided_at, created_at, expires_at, received_at, decision, outcome";

fn proposal_row(r: &Row) -> Result<ProposalRecord, Error> {
    Ok(ProposalRecord {
        proposal_id: r.get(0)?,
        gateway_id: r.get(1)?,
        session_id: r.get(2)?,
        attempt: r.get(3)?,
        rule: r.get(4)?,
        fields: json_col(5, r.get(5)?)?,
        sentence: r.get(6)?,
        digest: r.get(7)?,
        state: parse_word(8, r.get(8)?, ProposalState::parse)?,
        approver: r.get(9)?,
        decided_at: r.get(10)?,
        created_at: r.get(11)?,
        expires_at: r.get(12)?,
        received_at: r.get(13)?,
        decision: r
            .get::<_, Option<String>>(14)?
            .map(|t| json_col(14, t))
            .transpose()?,
        outcome: r.get(15)?,
    })
}
