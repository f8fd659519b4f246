//! Sessions and their attempts: the state machine's rows.
//!
//! A session's state is written in two places only, both given a decided
//! transition ([`Next`], which only [`crate::machine::next`] makes):
//! [`Tx::insert_session`] for a start, [`Tx::apply`] for everything after.

use std::net::IpAddr;
use std::time::SystemTime;

use serde::Serialize;

use super::db::{random_hex, Tx};
use super::value::{json_col, params, parse_word, OptionalExtension, Param, Row, Value};
use crate::error::Error;
use crate::lock::LockRule;
use crate::machine::{Next, Step};
use crate::model::{AttemptEnd, EndReason, IdleAction, Mode, OpenCause, State};
use crate::names::AttachSpec;

/// A session row.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Session {
    pub id: String,
    pub tenant: String,
    pub mode: Mode,
    pub state: State,
    pub created_at: String,
    pub ended_at: Option<String>,
    pub end_reason: Option<EndReason>,
    pub outcome: Option<String>,
    /// The destinations the session asked for (`--allow`), canonical.
    pub allow: Vec<String>,
    /// The attachments the session asked for (`--attach`).
    pub attach: Vec<AttachSpec>,
    pub sources: Vec<IpAddr>,
    /// The idle timeout (mode commands only), in seconds, and what it does.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub idle_timeout_seconds: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub idle_action: Option<IdleAction>,
    /// The last start, resume, recovery or attach: idle time counts from it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_activity_at: Option<String>,
    /// The hard stop: the most compute time the session runs, in seconds
    /// (3,600 to 604,800; a [`crate::model::StopAfter`] when set). None:
    /// no hard stop.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stop_after_seconds: Option<u32>,
}

/// The columns of a session row, in [`session_row`]'s order.
const SESSION_COLUMNS: &str = "id, tenant, mode, state, created_at, ended_at, end_reason, outcome,
    allow, attach, sources, idle_timeout_seconds, idle_action, last_activity_at,
    stop_after_seconds";

/// An attempt row.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Attempt {
    pub n: u32,
    pub cause: OpenCause,
    pub started_at: String,
    pub ended_at: Option<String>,
    pub end_cause: Option<AttemptEnd>,
    /// What this attempt opened with: the asked names still on the egress
    /// list, and the attachments whose secret and destination remained.
    pub allowlist: Vec<String>,
    pub attachments: Vec<AttachSpec>,
    /// The Lock rules this attempt opened with.
    pub lock: Vec<LockRule>,
    /// The relay key (hex) this attempt opened with, if any.
    pub relay_public_key: Option<String>,
    /// The allowlist's names this attempt opened as passthrough: passed on
    /// without termination, nothing inside their connections seen.
    pub passthrough: Vec<String>,
    /// When the open's answers made it run: its compute counts from here
    /// to its end. None: it never ran (its open failed, or is in flight).
    pub running_at: Option<String>,
    /// Whether it opened with the account's lab setting on: decisions
    /// with no person's passkey assertion counted on its gateways.
    pub lab_approvals: bool,
}

impl Attempt {
    /// The span it ran, for metering its compute
    /// ([`crate::machine::compute_used`]): (began running, ended; none
    /// while it runs). None when it never ran, or its times do not parse.
    pub fn running_span(&self) -> Option<(SystemTime, Option<SystemTime>)> {
        let began = humantime::parse_rfc3339(self.running_at.as_deref()?).ok()?;
        let ended = match &self.ended_at {
            Some(t) => Some(humantime::parse_rfc3339(t).ok()?),
            None => None,
        };
        Some((began, ended))
    }
}

impl Tx<'_> {
    /// A session id no session has yet: `sbx-` and 12 random hex digits
    /// (the operating system's generator).
    pub fn new_session_id(&self) -> Result<String, Error> {
        loop {
            let id = format!("sbx-{}", random_hex(6)?);
            if self.session(&id)?.is_none() {
                return Ok(id);
            }
        }
    }

    /// Record a new session in the state `start` decided (its own `state`
    /// field is not read).
    pub fn insert_session(&self, s: &Session, start: &Next) -> Result<(), Error> {
        if start.step() != Step::Open(crate::model::OpenCause::Launch) {
            return Err(Error::Store(format!(
                "session {} is recorded by a start, not by {:?}",
                s.id,
                start.step()
            )));
        }
        self.conn.execute(
            &format!(
                "INSERT INTO sessions ({SESSION_COLUMNS})
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15)"
            ),
            params![
                s.id,
                s.tenant,
                s.mode.as_str(),
                start.state().as_str(),
                s.created_at,
                s.ended_at,
                s.end_reason.map(|r| r.as_str()),
                s.outcome,
                serde_json::to_string(&s.allow)?,
                serde_json::to_string(&s.attach)?,
                serde_json::to_string(&s.sources)?,
                s.idle_timeout_seconds,
                s.idle_action.map(|a| a.as_str()),
                s.last_activity_at,
                s.stop_after_seconds,
            ],
        )?;
        for source in &s.sources {
            self.conn.execute(
                "INSERT INTO session_sources (session_id, source) VALUES (?1, ?2)
                 ON CONFLICT DO NOTHING",
                params![s.id, source.to_string()],
            )?;
        }
        Ok(())
    }

    /// A session not over that has one of `sources`: (the address, the
    /// session), the first found. One indexed look-up per address.
    pub fn live_session_with_source(
        &self,
        sources: &[IpAddr],
    ) -> Result<Option<(IpAddr, String)>, Error> {
        for source in sources {
            let found: Option<String> = self
                .conn
                .query_row(
                    "SELECT s.id FROM session_sources ss JOIN sessions s ON s.id = ss.session_id
                     WHERE ss.source = ?1 AND s.state NOT IN ('ended', 'failed', 'reset_incomplete')
                     ORDER BY s.id LIMIT 1",
                    params![source.to_string()],
                    |r| r.get(0),
                )
                .optional()?;
            if let Some(id) = found {
                return Ok(Some((*source, id)));
            }
        }
        Ok(None)
    }

    /// The session `id`, if there is one.
    pub fn session(&self, id: &str) -> Result<Option<Session>, Error> {
        self.conn
            .query_row(
                &format!("SELECT {SESSION_COLUMNS} FROM sessions WHERE id = ?1"),
                params![id],
                session_row,
            )
            .optional()
    }

    /// Sessions in any of `states`.
    pub fn sessions_in(&self, states: &[State]) -> Result<Vec<Session>, Error> {
        if states.is_empty() {
            return Ok(Vec::new());
        }
        let words: Vec<Value> = states.iter().map(|s| s.as_str().value()).collect();
        let marks: Vec<String> = (1..=words.len()).map(|i| format!("?{i}")).collect();
        let mut stmt = self.conn.prepare(&format!(
            "SELECT {SESSION_COLUMNS} FROM sessions
             WHERE state IN ({}) ORDER BY id",
            marks.join(", ")
        ))?;
        let rows = stmt.query_map(words, session_row)?;
        rows.collect::<Result<Vec<_>, _>>()
    }

    /// Count sessions by state.
    pub fn session_counts(&self) -> Result<Vec<(State, u64)>, Error> {
        let mut stmt = self
            .conn
            .prepare("SELECT state, count(*) FROM sessions GROUP BY state")?;
        let rows = stmt.query_map([], |r| {
            Ok((
                parse_word(0, r.get(0)?, State::parse)?,
                u64::try_from(r.get::<_, i64>(1)?).unwrap_or(0),
            ))
        })?;
        rows.collect::<Result<Vec<_>, _>>()
    }

    /// Write the transition `next` of session `id` at `at`: its state;
    /// the last activity when it counts idle time from now; why it ended,
    /// its outcome and when, when it ends it. The one writer of a
    /// session's state after its start.
    pub fn apply(&self, id: &str, next: &Next, at: &str) -> Result<(), Error> {
        let touched = next.touches().then_some(at);
        let ended = next
            .end_reason()
            .map(|why| (why.as_str(), next.outcome(), at));
        self.conn.execute(
            "UPDATE sessions SET state = ?2,
                 last_activity_at = coalesce(?3, last_activity_at),
                 end_reason = coalesce(?4, end_reason),
                 outcome = CASE WHEN ?4 IS NULL THEN outcome ELSE ?5 END,
                 ended_at = coalesce(?6, ended_at)
             WHERE id = ?1",
            params![
                id,
                next.state().as_str(),
                touched,
                ended.map(|e| e.0),
                ended.and_then(|e| e.1),
                ended.map(|e| e.2),
            ],
        )?;
        Ok(())
    }

    pub fn insert_attempt(&self, session_id: &str, a: &Attempt) -> Result<(), Error> {
        self.conn.execute(
            "INSERT INTO attempts (session_id, n, cause, started_at, ended_at, end_cause,
                                   allowlist, attachments, lock, relay_public_key,
                                   passthrough, running_at, lab_approvals)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13)",
            params![
                session_id,
                a.n,
                a.cause.as_str(),
                a.started_at,
                a.ended_at,
                a.end_cause.map(|c| c.as_str()),
                serde_json::to_string(&a.allowlist)?,
                serde_json::to_string(&a.attachments)?,
                serde_json::to_string(&a.lock)?,
                a.relay_public_key,
                serde_json::to_string(&a.passthrough)?,
                a.running_at,
                a.lab_approvals,
            ],
        )?;
        Ok(())
    }

    /// The session's attempts, in order.
    pub fn attempts(&self, session_id: &str) -> Result<Vec<Attempt>, Error> {
        let mut stmt = self.conn.prepare(&format!(
            "SELECT {ATTEMPT_COLUMNS} FROM attempts WHERE session_id = ?1 ORDER BY n"
        ))?;
        let rows = stmt.query_map(params![session_id], |r| attempt_row(r, 0))?;
        rows.collect::<Result<Vec<_>, _>>()
    }

    /// Every running session with its attempts and the CAs made for them,
    /// in three queries whatever their number (a lease renewal round reads
    /// this for every member).
    pub fn running_sessions_in_full(&self) -> Result<Vec<SessionInFull>, Error> {
        let mut by_id: std::collections::BTreeMap<String, SessionInFull> = self
            .sessions_in(&[State::Running])?
            .into_iter()
            .map(|s| (s.id.clone(), (s, Vec::new(), Vec::new())))
            .collect();
        let mut stmt = self.conn.prepare(&format!(
            "SELECT a.session_id, {} FROM attempts a JOIN sessions s ON s.id = a.session_id
             WHERE s.state = 'running' ORDER BY a.session_id, a.n",
            ATTEMPT_COLUMNS
                .split(',')
                .map(|c| format!("a.{}", c.trim()))
                .collect::<Vec<_>>()
                .join(", ")
        ))?;
        for row in stmt.query_map([], |r| Ok((r.get::<_, String>(0)?, attempt_row(r, 1)?)))? {
            let (id, attempt) = row?;
            if let Some(entry) = by_id.get_mut(&id) {
                entry.1.push(attempt);
            }
        }
        for (id, ca) in self.cas_of_running()? {
            if let Some(entry) = by_id.get_mut(&id) {
                entry.2.push(ca);
            }
        }
        Ok(by_id.into_values().collect())
    }

    /// Every open in flight: an attempt not ended of a session that is not
    /// running (a running session's last attempt is the one it runs; a
    /// paused or interrupted session's have all ended). (session, attempt,
    /// when it began), oldest first.
    pub fn opens_in_flight(&self) -> Result<Vec<(String, u32, String)>, Error> {
        let mut stmt = self.conn.prepare(
            "SELECT a.session_id, a.n, a.started_at FROM attempts a
             JOIN sessions s ON s.id = a.session_id
             WHERE a.ended_at IS NULL AND s.state <> 'running'
             ORDER BY a.started_at",
        )?;
        let rows = stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?;
        rows.collect::<Result<Vec<_>, _>>()
    }

    /// Attempt `n` of session `id` runs from `at`: its open's answers made
    /// it run (once; a later call changes nothing).
    pub fn run_attempt(&self, session_id: &str, n: u32, at: &str) -> Result<(), Error> {
        self.conn.execute(
            "UPDATE attempts SET running_at = ?3
             WHERE session_id = ?1 AND n = ?2 AND running_at IS NULL",
            params![session_id, n, at],
        )?;
        Ok(())
    }

    pub fn end_attempt(
        &self,
        session_id: &str,
        n: u32,
        end: AttemptEnd,
        at: &str,
    ) -> Result<(), Error> {
        self.conn.execute(
            "UPDATE attempts SET ended_at = ?3, end_cause = ?4 WHERE session_id = ?1 AND n = ?2",
            params![session_id, n, at, end.as_str()],
        )?;
        Ok(())
    }
}

/// A session, its attempts and the CAs made for them.
pub type SessionInFull = (Session, Vec<Attempt>, Vec<super::CaEvent>);

/// The columns of an attempt row, in [`attempt_row`]'s order.
const ATTEMPT_COLUMNS: &str = "n, cause, started_at, ended_at, end_cause, allowlist, attachments,
    lock, relay_public_key, passthrough, running_at, lab_approvals";

/// An attempt from the row's columns from `at` on.
fn attempt_row(r: &Row, at: usize) -> Result<Attempt, Error> {
    Ok(Attempt {
        n: r.get(at)?,
        cause: parse_word(at + 1, r.get(at + 1)?, OpenCause::parse)?,
        started_at: r.get(at + 2)?,
        ended_at: r.get(at + 3)?,
        end_cause: r
            .get::<_, Option<String>>(at + 4)?
            .map(|t| parse_word(at + 4, t, AttemptEnd::parse))
            .transpose()?,
        allowlist: json_col(at + 5, r.get(at + 5)?)?,
        attachments: json_col(at + 6, r.get(at + 6)?)?,
        lock: json_col(at + 7, r.get(at + 7)?)?,
        relay_public_key: r.get(at + 8)?,
        passthrough: json_col(at + 9, r.get(at + 9)?)?,
        running_at: r.get(at + 10)?,
        lab_approvals: r.get(at + 11)?,
    })
}

fn session_row(r: &Row) -> Result<Session, Error> {
    Ok(Session {
        id: r.get(0)?,
        tenant: r.get(1)?,
        mode: parse_word(2, r.get(2)?, Mode::parse)?,
        state: parse_word(3, r.get(3)?, State::parse)?,
        created_at: r.get(4)?,
        ended_at: r.get(5)?,
        end_reason: r
            .get::<_, Option<String>>(6)?
            .map(|t| parse_word(6, t, EndReason::parse))
            .transpose()?,
        outcome: r.get(7)?,
        allow: json_col(8, r.get(8)?)?,
        attach: json_col(9, r.get(9)?)?,
        sources: json_col(10, r.get(10)?)?,
        idle_timeout_seconds: r.get(11)?,
        idle_action: r
            .get::<_, Option<String>>(12)?
            .map(|t| parse_word(12, t, IdleAction::parse))
            .transpose()?,
        last_activity_at: r.get(13)?,
        stop_after_seconds: r.get(14)?,
    })
}
