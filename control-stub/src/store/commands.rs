//! Who asked: every command and time-driven event that moved a session,
//! one row each, never changed.

use serde::Serialize;

use super::db::Tx;
use super::value::{params, parse_word};
use crate::error::Error;

/// Who asked for a session's change.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Requester {
    /// `operator` (a CLI call), `approver` (the approvals API), or `time`
    /// (one of `serve`'s time-driven events).
    pub requester: RequesterKind,
    /// The operator's identity, the approver's name, or the time-driven
    /// cause (`idle_timeout_end`, …).
    pub requested_by: String,
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
    pub fn operator(name: &str) -> Requester {
        Requester {
            requester: RequesterKind::Operator,
            requested_by: name.to_owned(),
        }
    }

    pub fn time(cause: &str) -> Requester {
        Requester {
            requester: RequesterKind::Time,
            requested_by: cause.to_owned(),
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
            "INSERT INTO commands (session_id, n, event, requester, requested_by, attempt, at)
             VALUES (?1, (SELECT coalesce(max(n), 0) + 1 FROM commands WHERE session_id = ?1),
                     ?2, ?3, ?4, ?5, ?6)",
            params![
                session_id,
                event,
                by.requester.as_str(),
                by.requested_by,
                attempt,
                at
            ],
        )?;
        Ok(())
    }

    /// The session's commands, in the order they were committed.
    pub fn commands(&self, session_id: &str) -> Result<Vec<CommandRecord>, Error> {
        let mut stmt = self.conn.prepare(
            "SELECT event, requester, requested_by, attempt, at FROM commands
             WHERE session_id = ?1 ORDER BY n",
        )?;
        let rows = stmt.query_map(params![session_id], |r| {
            Ok(CommandRecord {
                event: r.get(0)?,
                by: Requester {
                    requester: parse_word(1, r.get(1)?, RequesterKind::parse)?,
                    requested_by: r.get(2)?,
                },
                attempt: r.get(3)?,
                at: r.get(4)?,
            })
        })?;
        rows.collect::<Result<Vec<_>, _>>()
    }
}
