//! The members of the pair and their control addresses: one list that
//! every CLI call and every `serve` reads (`gateway add ID --control
//! ADDR`), beside the registered keys (`gateways`).

use serde::Serialize;

use super::db::{now, Store, Tx};
use super::value::{params, OptionalExtension};
use crate::error::Error;
use crate::names;

/// A member: its id and the address of its control listener.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Member {
    pub id: String,
    pub control: String,
    pub added_at: String,
}

/// A member some live session needs (it holds or held an authority of a
/// session not over, or is owed a close) that has no control address.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Unaddressed {
    pub gateway_id: String,
    /// The sessions that need it, at most a few named.
    pub sessions: Vec<String>,
    pub session_count: u64,
}

/// The most sessions an [`Unaddressed`] names.
const NAMED_SESSIONS: usize = 5;

/// `HOST:PORT`, as a control address is given: a host name or an IP
/// address (IPv6 in brackets) and a port.
fn control_addr(text: &str) -> Result<String, Error> {
    let invalid = |reason: &str| Error::NameInvalid {
        what: "control address",
        got: text.chars().take(300).collect(),
        reason: reason.into(),
    };
    if let Ok(addr) = text.parse::<std::net::SocketAddr>() {
        if addr.port() == 0 {
            return Err(invalid("the port must be a number from 1 to 65535"));
        }
        return Ok(text.to_owned());
    }
    let (host, port) = text
        .rsplit_once(':')
        .ok_or_else(|| invalid("a control address is HOST:PORT"))?;
    port.parse::<u16>()
        .ok()
        .filter(|p| *p != 0)
        .ok_or_else(|| invalid("the port must be a number from 1 to 65535"))?;
    let host_ok = !host.is_empty()
        && host.len() <= 253
        && host.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && label
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-')
                && !label.starts_with('-')
                && !label.ends_with('-')
        });
    if !host_ok {
        return Err(invalid(
            "the host must be a DNS name or an IP address (IPv6 in brackets)",
        ));
    }
    Ok(text.to_owned())
}

impl Store {
    /// Add member `id` at control address `control`, or move it there.
    /// Returns the member as stored.
    pub fn add_member(&mut self, id: &str, control: &str) -> Result<Member, Error> {
        let id = names::gateway_id(id)?;
        let control = control_addr(control)?;
        let at = now();
        self.write(|tx| {
            tx.conn.execute(
                "INSERT INTO members (id, control, added_at) VALUES (?1, ?2, ?3)
                 ON CONFLICT (id) DO UPDATE SET control = excluded.control",
                params![id, control, at],
            )?;
            tx.member(&id)?
                .ok_or_else(|| Error::Store(format!("member {id} not stored")))
        })
    }

    /// Remove member `id`. Refused while a live session needs it (its
    /// closes could no longer be asked).
    pub fn remove_member(&mut self, id: &str) -> Result<(), Error> {
        self.write(|tx| {
            if tx.member(id)?.is_none() {
                return Err(Error::GatewayNotFound {
                    gateway_id: id.chars().take(names::MAX_GATEWAY_ID_LEN).collect(),
                });
            }
            let needing = tx.sessions_needing(id)?;
            if !needing.is_empty() {
                return Err(Error::GatewayInUse {
                    gateway_id: id.to_owned(),
                    sessions: needing.len() as u64,
                    first: needing[0].clone(),
                });
            }
            tx.conn
                .execute("DELETE FROM members WHERE id = ?1", params![id])?;
            Ok(())
        })
    }

    /// Every member, by id.
    pub fn members(&self) -> Result<Vec<Member>, Error> {
        self.read(|tx| tx.member_list())
    }

    /// The members live sessions need that have no control address,
    /// given `also` as addressed (the `--gateway` overrides of a call).
    pub fn unaddressed(&self, also: &[String]) -> Result<Vec<Unaddressed>, Error> {
        self.read(|tx| {
            let addressed: Vec<String> = tx.member_list()?.into_iter().map(|m| m.id).collect();
            let mut out = Vec::new();
            for gateway_id in tx.needed_members()? {
                if addressed.contains(&gateway_id) || also.contains(&gateway_id) {
                    continue;
                }
                let sessions = tx.sessions_needing(&gateway_id)?;
                out.push(Unaddressed {
                    gateway_id,
                    session_count: sessions.len() as u64,
                    sessions: sessions.into_iter().take(NAMED_SESSIONS).collect(),
                });
            }
            Ok(out)
        })
    }
}

impl Tx<'_> {
    pub fn member(&self, id: &str) -> Result<Option<Member>, Error> {
        self.conn
            .query_row(
                "SELECT id, control, added_at FROM members WHERE id = ?1",
                params![id],
                |r| {
                    Ok(Member {
                        id: r.get(0)?,
                        control: r.get(1)?,
                        added_at: r.get(2)?,
                    })
                },
            )
            .optional()
    }

    pub fn member_list(&self) -> Result<Vec<Member>, Error> {
        let mut stmt = self
            .conn
            .prepare("SELECT id, control, added_at FROM members ORDER BY id")?;
        let rows = stmt.query_map([], |r| {
            Ok(Member {
                id: r.get(0)?,
                control: r.get(1)?,
                added_at: r.get(2)?,
            })
        })?;
        rows.collect::<Result<Vec<_>, _>>()
    }

    /// What makes a session need a member: a CA it made for an attempt
    /// that has not ended, of a session that is not over; or a close owed
    /// to it.
    const NEEDS: &'static str = "
        SELECT c.gateway_id AS gateway_id, c.session_id AS session_id
        FROM ca_events c
        JOIN attempts a ON a.session_id = c.session_id AND a.n = c.attempt
        JOIN sessions s ON s.id = c.session_id
        WHERE a.ended_at IS NULL AND c.destroyed_at IS NULL
          AND s.state NOT IN ('ended', 'failed', 'reset_incomplete')
        UNION
        SELECT gateway_id, session_id FROM close_tasks WHERE confirmed_at IS NULL";

    /// Every member some live session needs, by id.
    fn needed_members(&self) -> Result<Vec<String>, Error> {
        let sql = format!(
            "SELECT DISTINCT gateway_id FROM ({}) needs ORDER BY gateway_id",
            Self::NEEDS
        );
        let mut stmt = self.conn.prepare(&sql)?;
        let rows = stmt.query_map([], |r| r.get(0))?;
        rows.collect::<Result<Vec<_>, _>>()
    }

    /// The sessions that need member `id`, by id.
    fn sessions_needing(&self, id: &str) -> Result<Vec<String>, Error> {
        let sql = format!(
            "SELECT DISTINCT session_id FROM ({}) needs WHERE gateway_id = ?1 ORDER BY session_id",
            Self::NEEDS
        );
        let mut stmt = self.conn.prepare(&sql)?;
        let rows = stmt.query_map(params![id], |r| r.get(0))?;
        rows.collect::<Result<Vec<_>, _>>()
    }
}
