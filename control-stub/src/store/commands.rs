//! Who asked: every command and time-driven event that moved a session,
//! one row each, never changed.

use super::db::params;
use serde::Serialize;

use super::db::{json_col, parse_word, Tx};
use super::people::SignedByPasskey;
use crate::error::Error;

/// Who asked for a session's change.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Requester {
    /// `operator` (a CLI call, or an operator in the web app), `approver`,
    /// or `time` (one of `serve`'s time-driven events).
    pub requester: RequesterKind,
    /// The operator's identity, the person's name, or the time-driven
    /// cause (`idle_timeout_end`, …).
    pub requested_by: String,
    /// Whether a passkey proved who asked: true only for a command a
    /// person signed in the web app, whose assertion is `assertion`. A
    /// command-line call names its operator (`--operator`,
    /// `TALOS_OPERATOR`, the login name) and nothing proves it: false.
    pub verified: bool,
    /// The person's passkey assertion over the command's challenge
    /// (`talos_certs::webauthn::command_challenge`), as verified.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub assertion: Option<SignedByPasskey>,
}

crate::model::words! {
    /// The kinds of requester.
    pub enum RequesterKind {
        Operator => "operator",
        Approver => "approver",
        Time => "time",
    }
}

impl Requester {
    /// An operator named by the command line: not verified.
    pub fn operator(name: &str) -> Requester {
        Requester {
            requester: RequesterKind::Operator,
            requested_by: name.to_owned(),
            verified: false,
            assertion: None,
        }
    }

    /// A person whose passkey signed the command (`assertion`, verified).
    pub fn verified(kind: RequesterKind, assertion: SignedByPasskey) -> Requester {
        Requester {
            requester: kind,
            requested_by: assertion.person.clone(),
            verified: true,
            assertion: Some(assertion),
        }
    }

    pub fn time(cause: &str) -> Requester {
        Requester {
            requester: RequesterKind::Time,
            requested_by: cause.to_owned(),
            verified: false,
            assertion: None,
        }
    }
}

/// One recorded command.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct CommandRecord {
    /// The machine's event: `start`, `pause`, `resume`, `interrupt`,
    /// `recover`, `stop`, `revoke_all`, or a time-driven one.
    pub event: String,
    #[serde(flatten)]
    pub by: Requester,
    /// The attempt it opened or ended, when it concerned one.
    pub attempt: Option<u32>,
    pub at: String,
}

impl Tx<'_> {
    /// Record that `by` asked for `event` on session `session_id` at `at`.
    pub fn record_command(
        &self,
        session_id: &str,
        event: &str,
        by: &Requester,
        attempt: Option<u32>,
        at: &str,
    ) -> Result<(), Error> {
        self.conn.execute(
            "INSERT INTO commands (session_id, n, event, requester, requested_by, attempt, at,
                                   verified, assertion)
             VALUES (?1, (SELECT coalesce(max(n), 0) + 1 FROM commands WHERE session_id = ?1),
                     ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
            params![
                session_id,
                event,
                by.requester.as_str(),
                by.requested_by,
                attempt,
                at,
                by.verified,
                by.assertion
                    .as_ref()
                    .map(serde_json::to_string)
                    .transpose()?,
            ],
        )?;
        Ok(())
    }

    /// The session's commands, in the order they were committed.
    pub fn commands(&self, session_id: &str) -> Result<Vec<CommandRecord>, Error> {
        let mut stmt = self.conn.prepare(
            "SELECT event, requester, requested_by, attempt, at, verified, assertion FROM commands
             WHERE session_id = ?1 ORDER BY n",
        )?;
        let rows = stmt.query_map(params![session_id], |r| {
            Ok(CommandRecord {
                event: r.get(0)?,
                by: Requester {
                    requester: parse_word(1, r.get(1)?, RequesterKind::parse)?,
                    requested_by: r.get(2)?,
                    verified: r.get(5)?,
                    assertion: r
                        .get::<_, Option<String>>(6)?
                        .map(|t| json_col(6, t))
                        .transpose()?,
                },
                attempt: r.get(3)?,
                at: r.get(4)?,
            })
        })?;
        rows.collect::<Result<Vec<_>, _>>()
    }
}
