//! The approval relay's table: the gateways' proposals with their
//! decisions, and the passkey assertion that authorised each decision a
//! person made in the web app.

use serde::Serialize;

use super::db::Tx;
use super::people::SignedByPasskey;
use super::value::{json_col, params, parse_word, OptionalExtension, Row};
use crate::error::Error;
use crate::model::ProposalState;

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
    /// The person's passkey assertion over the decision's challenge
    /// (`talos_certs::webauthn::decision_challenge`), as the web app
    /// verified it; none for a decision made with `approvals approve|decline
    /// --as` (tests and labs), which nothing signed but the relay.
    pub assertion: Option<SignedByPasskey>,
    /// The card that answers this proposal, when it is not a card itself:
    /// a `first_use` rule's proposal joined to the first one of the same
    /// session attempt and rule (one card across the pair), decided when
    /// that card is, with its decision.
    pub answered_by: Option<String>,
}

impl Tx<'_> {
    pub fn insert_proposal(&self, p: &ProposalRecord) -> Result<(), Error> {
        self.conn.execute(
            &format!(
                "INSERT INTO proposals ({PROPOSAL_COLUMNS})
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16,
                         ?17, ?18)"
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
                p.assertion
                    .as_ref()
                    .map(serde_json::to_string)
                    .transpose()?,
                p.answered_by,
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

    /// Record a delivered decision on a pending proposal, with the
    /// passkey assertion that authorised it, if a person signed it.
    #[allow(clippy::too_many_arguments)]
    pub fn decide_proposal(
        &self,
        id: &str,
        state: ProposalState,
        approver: &str,
        at: &str,
        decision: &serde_json::Value,
        outcome: &str,
        assertion: Option<&SignedByPasskey>,
    ) -> Result<(), Error> {
        self.conn.execute(
            "UPDATE proposals SET state = ?2, approver = ?3, decided_at = ?4, decision = ?5,
                                  outcome = ?6, assertion = ?7
             WHERE proposal_id = ?1 AND state = 'pending'",
            params![
                id,
                state.as_str(),
                approver,
                at,
                serde_json::to_string(decision)?,
                outcome,
                assertion.map(serde_json::to_string).transpose()?,
            ],
        )?;
        Ok(())
    }

    /// The pending proposals joined to card `card_id`, in order of
    /// receipt.
    pub fn joined_to(&self, card_id: &str) -> Result<Vec<ProposalRecord>, Error> {
        let mut stmt = self.conn.prepare(&format!(
            "SELECT {PROPOSAL_COLUMNS} FROM proposals
             WHERE answered_by = ?1 AND state = 'pending' ORDER BY rowid"
        ))?;
        let rows = stmt.query_map(params![card_id], proposal_row)?;
        rows.collect::<Result<Vec<_>, _>>()
    }

    /// Every pending proposal joined to a card, in order of receipt.
    pub fn joined_pending(&self) -> Result<Vec<ProposalRecord>, Error> {
        let mut stmt = self.conn.prepare(&format!(
            "SELECT {PROPOSAL_COLUMNS} FROM proposals
             WHERE answered_by IS NOT NULL AND state = 'pending' ORDER BY rowid"
        ))?;
        let rows = stmt.query_map(params![], proposal_row)?;
        rows.collect::<Result<Vec<_>, _>>()
    }

    /// Make a joined proposal a card of its own (its card ended with no
    /// decision: expired or withdrawn).
    pub fn unjoin_proposal(&self, id: &str) -> Result<(), Error> {
        self.conn.execute(
            "UPDATE proposals SET answered_by = NULL WHERE proposal_id = ?1 AND state = 'pending'",
            params![id],
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
}

const PROPOSAL_COLUMNS: &str =
    "proposal_id, gateway_id, session_id, attempt, rule, fields, sentence,
     digest, state, approver, decided_at, created_at, expires_at, received_at, decision, outcome,
     assertion, answered_by";

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
        assertion: r
            .get::<_, Option<String>>(16)?
            .map(|t| json_col(16, t))
            .transpose()?,
        answered_by: r.get(17)?,
    })
}

impl Tx<'_> {
    /// What changes whenever a card starts or stops waiting: the pending
    /// proposals' count and the newest one's position. The web app's card
    /// watch reads it every few hundred milliseconds, on every replica.
    pub fn pending_fingerprint(&self) -> Result<(i64, i64), Error> {
        Ok(self.conn.query_row(
            "SELECT count(*), coalesce(max(rowid), 0) FROM proposals
             WHERE state = 'pending' AND answered_by IS NULL",
            params![],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )?)
    }
}
