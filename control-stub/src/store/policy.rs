//! The account's policy: the egress list, the destinations passed on
//! without termination (passthrough), and the Lock's rules.
//!
//! A passthrough destination can carry neither an attachment nor a Lock
//! rule (the gateway never sees its requests): each command that would
//! join the two refuses, naming the destination (`passthrough_conflict`).

use super::db::{params, OptionalExtension, Row};

use super::db::{json_col, now, parse_word, random_hex, Store, Tx};
use crate::error::Error;
use crate::lock::{LockRule, NewRule};
use crate::model::{LockMode, State};
use crate::names;

impl Store {
    /// Add `name` (canonicalised) to the egress list; returns the canonical
    /// name. Adding a name already there changes nothing.
    pub fn egress_add(&mut self, name: &str) -> Result<String, Error> {
        let name = names::destination(name)?;
        self.write(|tx| {
            tx.conn.execute(
                "INSERT INTO egress (name, added_at) VALUES (?1, ?2) ON CONFLICT DO NOTHING",
                params![name, now()],
            )?;
            Ok(())
        })?;
        Ok(name)
    }

    /// Remove `name` from the egress list. Running sessions keep it until
    /// they pause; a resume or recovery leaves it out.
    pub fn egress_remove(&mut self, name: &str) -> Result<String, Error> {
        let name = names::destination(name)?;
        self.write(|tx| {
            let n = tx
                .conn
                .execute("DELETE FROM egress WHERE name = ?1", params![name])?;
            if n == 0 {
                return Err(Error::EgressNotFound { name: name.clone() });
            }
            Ok(())
        })?;
        Ok(name)
    }

    /// The egress list, sorted.
    pub fn egress_list(&self) -> Result<Vec<String>, Error> {
        self.read(|tx| tx.egress_names())
    }

    /// Mark `name` (canonicalised) passthrough; returns the canonical
    /// name. Refused while a Lock rule names it or a session that has not
    /// ended attaches a credential to it. Marking a name already marked
    /// changes nothing. Sessions running keep terminating it until their
    /// next open (resume, recovery), as with every policy change.
    pub fn passthrough_add(&mut self, name: &str) -> Result<String, Error> {
        let name = names::destination(name)?;
        self.write(|tx| {
            if let Some(rule) = tx.lock_rules()?.iter().find(|r| r.destination == name) {
                return Err(Error::PassthroughConflict {
                    destination: name.clone(),
                    what: format!(
                        "cannot be made passthrough: Lock rule {} names it, and the gateway never sees a passthrough destination's requests; remove the rule first",
                        rule.id
                    ),
                });
            }
            let live = tx.sessions_in(&State::NOT_OVER)?;
            if let Some((s, a)) = live
                .iter()
                .find_map(|s| s.attach.iter().find(|a| a.destination == name).map(|a| (s, a)))
            {
                return Err(Error::PassthroughConflict {
                    destination: name.clone(),
                    what: format!(
                        "cannot be made passthrough: session {} attaches secret {} to it, which the gateway could no longer inject; end that session first",
                        s.id, a.secret
                    ),
                });
            }
            tx.conn.execute(
                "INSERT INTO passthrough (name, added_at) VALUES (?1, ?2) ON CONFLICT DO NOTHING",
                params![name, now()],
            )?;
            Ok(())
        })?;
        Ok(name)
    }

    /// Terminate `name` again like any other destination, from each
    /// session's next open.
    pub fn passthrough_remove(&mut self, name: &str) -> Result<String, Error> {
        let name = names::destination(name)?;
        self.write(|tx| {
            let n = tx
                .conn
                .execute("DELETE FROM passthrough WHERE name = ?1", params![name])?;
            if n == 0 {
                return Err(Error::PassthroughNotFound { name: name.clone() });
            }
            Ok(())
        })?;
        Ok(name)
    }

    /// The passthrough destinations, sorted.
    pub fn passthrough_list(&self) -> Result<Vec<String>, Error> {
        self.read(|tx| tx.passthrough_names())
    }

    /// Add a checked rule; returns it with its new id. A rule naming a
    /// passthrough destination is refused; a rule for any destination
    /// (`*`) reaches only the destinations the gateway terminates. Every
    /// approver it names must be a person holding a passkey (checked in
    /// the same transaction as the insert): a rule naming anyone else
    /// would hold requests nobody of that name can decide
    /// (`approver_not_enrolled`, naming the first such approver).
    pub fn lock_add(&mut self, rule: &NewRule) -> Result<LockRule, Error> {
        self.write(|tx| {
            if tx.passthrough_names()?.contains(&rule.destination) {
                return Err(Error::PassthroughConflict {
                    destination: rule.destination.clone(),
                    what: "is passthrough: the gateway passes its connections on without seeing a request, so no Lock rule can hold one; name another destination, or remove the passthrough mark first".into(),
                });
            }
            let enrolled = tx.enrolled(&rule.approvers)?;
            if let Some(missing) = rule.approvers.iter().find(|a| !enrolled.contains(a)) {
                return Err(Error::ApproverNotEnrolled {
                    name: missing.clone(),
                });
            }
            tx.insert_lock_rule(rule)
        })
    }

    /// The Lock's rules, oldest first.
    pub fn lock_list(&self) -> Result<Vec<LockRule>, Error> {
        self.read(|tx| tx.lock_rules())
    }

    /// Remove rule `id`; returns it. Sessions already running keep it until
    /// their next open; proposals it made keep naming it, and can no longer
    /// be decided (no approver is listed by a rule that is gone).
    pub fn lock_remove(&mut self, id: &str) -> Result<LockRule, Error> {
        self.write(|tx| {
            let rule = tx.lock_rule(id)?.ok_or_else(|| Error::LockRuleNotFound {
                id: id.chars().take(100).collect(),
            })?;
            tx.conn
                .execute("DELETE FROM lock_rules WHERE id = ?1", params![id])?;
            Ok(rule)
        })
    }
}

impl Tx<'_> {
    /// The passthrough destinations, sorted.
    pub fn passthrough_names(&self) -> Result<Vec<String>, Error> {
        let mut stmt = self
            .conn
            .prepare("SELECT name FROM passthrough ORDER BY name")?;
        let rows = stmt.query_map([], |r| r.get(0))?;
        rows.collect::<Result<Vec<String>, _>>()
    }

    /// The egress list, sorted.
    pub fn egress_names(&self) -> Result<Vec<String>, Error> {
        let mut stmt = self.conn.prepare("SELECT name FROM egress ORDER BY name")?;
        let rows = stmt.query_map([], |r| r.get(0))?;
        rows.collect::<Result<Vec<String>, _>>()
    }

    /// Add a rule; its id is `lock-N`, N never used before.
    pub fn insert_lock_rule(&self, rule: &NewRule) -> Result<LockRule, Error> {
        let created_at = now();
        // The row gets its number first; the id is made from it.
        let n: i64 = self.conn.query_row(
            "INSERT INTO lock_rules (id, destination, attachment, method, path_prefix, mode,
                                     approvers, created_at)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8) RETURNING n",
            params![
                format!("new-{}", random_hex(8)?),
                rule.destination,
                rule.attachment,
                rule.method,
                rule.path_prefix,
                rule.mode.as_str(),
                serde_json::to_string(&rule.approvers)?,
                created_at,
            ],
            |r| r.get(0),
        )?;
        let id = format!("lock-{n}");
        self.conn
            .execute("UPDATE lock_rules SET id = ?2 WHERE n = ?1", params![n, id])?;
        Ok(LockRule {
            id,
            destination: rule.destination.clone(),
            attachment: rule.attachment.clone(),
            method: rule.method.clone(),
            path_prefix: rule.path_prefix.clone(),
            mode: rule.mode,
            approvers: rule.approvers.clone(),
            created_at,
        })
    }

    /// Every rule, oldest first.
    pub fn lock_rules(&self) -> Result<Vec<LockRule>, Error> {
        let mut stmt = self
            .conn
            .prepare(&format!("SELECT {LOCK_COLUMNS} FROM lock_rules ORDER BY n"))?;
        let rows = stmt.query_map([], lock_rule_row)?;
        rows.collect::<Result<Vec<_>, _>>()
    }

    /// Rule `id`, if it exists.
    pub fn lock_rule(&self, id: &str) -> Result<Option<LockRule>, Error> {
        self.conn
            .query_row(
                &format!("SELECT {LOCK_COLUMNS} FROM lock_rules WHERE id = ?1"),
                params![id],
                lock_rule_row,
            )
            .optional()
    }
}

const LOCK_COLUMNS: &str =
    "id, destination, attachment, method, path_prefix, mode, approvers, created_at";

fn lock_rule_row(r: &Row) -> Result<LockRule, Error> {
    Ok(LockRule {
        id: r.get(0)?,
        destination: r.get(1)?,
        attachment: r.get(2)?,
        method: r.get(3)?,
        path_prefix: r.get(4)?,
        mode: parse_word(5, r.get(5)?, LockMode::parse)?,
        approvers: json_col(6, r.get(6)?)?,
        created_at: r.get(7)?,
    })
}
