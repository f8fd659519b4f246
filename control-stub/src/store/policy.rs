//! The account's policy: the egress list and the Lock's rules.

use super::db::{params, OptionalExtension, Row};

use super::db::{json_col, now, parse_word, random_hex, Store, Tx};
use crate::error::Error;
use crate::lock::{LockRule, NewRule};
use crate::model::LockMode;
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

    /// Add a checked rule; returns it with its new id.
    pub fn lock_add(&mut self, rule: &NewRule) -> Result<LockRule, Error> {
        self.write(|tx| tx.insert_lock_rule(rule))
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
