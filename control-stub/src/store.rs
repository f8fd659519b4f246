//! The control stub's store: one SQLite file.
//!
//! The file is created with mode 0600 (it holds the secret store), and an
//! existing file that others may read or write is refused. It runs in WAL
//! mode with `synchronous = FULL` (a recorded CA destruction survives a
//! power cut) and `secure_delete = ON` (a deleted or replaced secret value
//! is overwritten in the file, not just unlinked from the b-tree; the WAL is
//! checkpointed and truncated after every change to a secret, so no old
//! frame keeps it either — what the filesystem keeps of freed blocks is out
//! of reach).
//!
//! The schema is versioned with `PRAGMA user_version` and created on first
//! use (version 3; an older file is upgraded in place: version 1 gains
//! `chain_state`, version 2 the Lock's tables and the attempts' `lock` and
//! `relay_public_key`):
//!
//! | table | one row per | columns |
//! |---|---|---|
//! | `egress` | name on the account's egress list (one account; the list is global) | `name` (canonical), `added_at` |
//! | `secrets` | secret of a tenant | `tenant`, `name`, `value` (BLOB, as given; no command prints it), `updated_at` |
//! | `gateways` | registered gateway | `id`, `public_key_hex`, `registered_at` |
//! | `sessions` | session | `id`, `tenant`, `mode`, `state`, `created_at`, `ended_at`, `end_reason`, `outcome`, `allow` (JSON: the names asked), `attach` (JSON: the attachments asked, no values), `sources` (JSON) |
//! | `attempts` | attempt of a session | `session_id`, `n` (from 1), `cause`, `started_at`, `ended_at`, `end_cause`, `allowlist` and `attachments` (JSON: what this attempt opened with), `lock` (JSON: the Lock rules sent at this open), `relay_public_key` (hex; NULL when none was sent) |
//! | `ca_events` | CA a gateway made for an attempt | `session_id`, `attempt`, `gateway_id`, `digest`, `cert_pem`, `made_at`, `destroyed_at`, `destroy_reason` (set only when a verified drop report names this digest) |
//! | `drop_reports` | drop report a gateway returned | `session_id`, `attempt` (the attempt whose authority was dropped), `gateway_id`, `reason`, `ca_digest`, `secrets` (JSON), `signed` (the signed bytes), `received_at`, `verifier`, `ca_error`, `secrets_error` (NULL when that half checked out) |
//! | `reset_steps` | reset step of an ended session | `session_id`, `step` (1–5), `name`, `confirmed`, `response` (JSON), `error`, `at` |
//! | `batches` | verified batch received | `gateway_id`, `seq`, `digest`, `received_at` |
//! | `connection_records` | connection record of a batch | `gateway_id`, `seq`, `idx` (position in the batch), `session_id` (from the record; NULL for `unknown_source`), `json` |
//! | `batch_rejections` | batch refused by the batch consumer | `gateway_id`, `seq`, `reason`, `at` |
//! | `chain_state` | gateway whose batches were accepted | `gateway_id`, `json` (talos-certs `ChainState`: last seq and recent digests) |
//! | `lock_rules` | Lock rule | `n` (never reused), `id` (`lock-N`), `destination` (canonical or `*`), `attachment`, `method`, `path_prefix` (empty: any), `mode`, `approvers` (JSON, sorted), `created_at` |
//! | `proposals` | proposal a gateway sent the relay | `proposal_id`, `gateway_id`, `session_id`, `attempt`, `rule`, `fields` (JSON: the talos-certs `Proposal`), `sentence`, `digest`, `state` (`pending`, `approved`, `declined`, `withdrawn`, `expired`), `approver`, `decided_at` (when it left `pending`), `created_at`, `expires_at` (the gateway's), `received_at`, `decision` (JSON: the signed envelope delivered), `outcome` (the gateway's answer: `released` or `refused`) |
//! | `approvers` | approver of the approvals API | `name`, `token_sha256` (hex; the token itself is shown once and never stored), `created_at` |
//!
//! Every change runs in one transaction ([`Store::write`]); a failing
//! operation changes nothing.

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use rusqlite::{params, Connection, OptionalExtension, TransactionBehavior};
use serde::Serialize;
use zeroize::Zeroizing;

use crate::error::Error;
use crate::lock::{LockRule, NewRule};
use crate::model::{
    AttemptEnd, CloseReason, EndReason, LockMode, Mode, OpenCause, ProposalState, State,
};
use crate::names::{self, AttachSpec};

/// The schema version this code writes (`PRAGMA user_version`).
pub const SCHEMA_VERSION: i64 = 3;

/// Where the CLI keeps its store unless `--db` says otherwise.
pub const DEFAULT_PATH: &str = "./control-stub.db";

/// How long a write waits for another process's write to finish. A
/// transition holds the write lock while it talks to the gateways, so this
/// is longer than one control-channel round trip should ever take.
pub const BUSY_TIMEOUT: Duration = Duration::from_secs(10);

const SCHEMA_V1: &str = r#"
CREATE TABLE egress (
    name TEXT PRIMARY KEY NOT NULL,
    added_at TEXT NOT NULL
);
CREATE TABLE secrets (
    tenant TEXT NOT NULL,
    name TEXT NOT NULL,
    value BLOB NOT NULL,
    updated_at TEXT NOT NULL,
    PRIMARY KEY (tenant, name)
);
CREATE TABLE gateways (
    id TEXT PRIMARY KEY NOT NULL,
    public_key_hex TEXT NOT NULL,
    registered_at TEXT NOT NULL
);
CREATE TABLE sessions (
    id TEXT PRIMARY KEY NOT NULL,
    tenant TEXT NOT NULL,
    mode TEXT NOT NULL CHECK (mode IN ('agent', 'commands')),
    state TEXT NOT NULL
        CHECK (state IN ('running', 'paused', 'interrupted', 'ended', 'reset_incomplete')),
    created_at TEXT NOT NULL,
    ended_at TEXT,
    end_reason TEXT,
    outcome TEXT,
    allow TEXT NOT NULL,
    attach TEXT NOT NULL,
    sources TEXT NOT NULL
);
CREATE TABLE attempts (
    session_id TEXT NOT NULL REFERENCES sessions (id),
    n INTEGER NOT NULL CHECK (n >= 1),
    cause TEXT NOT NULL CHECK (cause IN ('launch', 'resume', 'recovery')),
    started_at TEXT NOT NULL,
    ended_at TEXT,
    end_cause TEXT,
    allowlist TEXT NOT NULL,
    attachments TEXT NOT NULL,
    PRIMARY KEY (session_id, n)
);
CREATE TABLE ca_events (
    session_id TEXT NOT NULL,
    attempt INTEGER NOT NULL,
    gateway_id TEXT NOT NULL,
    digest TEXT NOT NULL,
    cert_pem TEXT NOT NULL,
    made_at TEXT NOT NULL,
    destroyed_at TEXT,
    destroy_reason TEXT,
    PRIMARY KEY (session_id, attempt, gateway_id),
    FOREIGN KEY (session_id, attempt) REFERENCES attempts (session_id, n)
);
CREATE TABLE drop_reports (
    session_id TEXT NOT NULL,
    attempt INTEGER NOT NULL,
    gateway_id TEXT NOT NULL,
    reason TEXT NOT NULL,
    ca_digest TEXT NOT NULL,
    secrets TEXT NOT NULL,
    signed BLOB NOT NULL,
    received_at TEXT NOT NULL,
    verifier TEXT NOT NULL,
    ca_error TEXT,
    secrets_error TEXT,
    FOREIGN KEY (session_id, attempt) REFERENCES attempts (session_id, n)
);
CREATE INDEX drop_reports_by_attempt ON drop_reports (session_id, attempt);
CREATE TABLE reset_steps (
    session_id TEXT NOT NULL REFERENCES sessions (id),
    step INTEGER NOT NULL CHECK (step BETWEEN 1 AND 5),
    name TEXT NOT NULL,
    confirmed INTEGER NOT NULL CHECK (confirmed IN (0, 1)),
    response TEXT NOT NULL,
    error TEXT,
    at TEXT NOT NULL,
    PRIMARY KEY (session_id, step)
);
CREATE TABLE batches (
    gateway_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    digest TEXT NOT NULL,
    received_at TEXT NOT NULL,
    PRIMARY KEY (gateway_id, seq)
);
CREATE TABLE connection_records (
    gateway_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    idx INTEGER NOT NULL,
    session_id TEXT,
    json TEXT NOT NULL,
    PRIMARY KEY (gateway_id, seq, idx),
    FOREIGN KEY (gateway_id, seq) REFERENCES batches (gateway_id, seq)
);
CREATE INDEX connection_records_by_session ON connection_records (session_id);
CREATE TABLE batch_rejections (
    gateway_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    reason TEXT NOT NULL,
    at TEXT NOT NULL
);
"#;

/// Version 2: the batch consumer's chain position per gateway, updated in
/// the transaction that records each accepted batch.
const SCHEMA_V2: &str = r#"
CREATE TABLE chain_state (
    gateway_id TEXT PRIMARY KEY NOT NULL,
    json TEXT NOT NULL
);
"#;

/// Version 3: the Lock's rules, the relay's proposals, the approvals API's
/// approvers, and what each attempt opened with of the Lock.
const SCHEMA_V3: &str = r#"
CREATE TABLE lock_rules (
    n INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT UNIQUE NOT NULL,
    destination TEXT NOT NULL,
    attachment TEXT NOT NULL,
    method TEXT NOT NULL,
    path_prefix TEXT NOT NULL,
    mode TEXT NOT NULL CHECK (mode IN ('first_use', 'every_request')),
    approvers TEXT NOT NULL,
    created_at TEXT NOT NULL
);
CREATE TABLE proposals (
    proposal_id TEXT PRIMARY KEY NOT NULL,
    gateway_id TEXT NOT NULL,
    session_id TEXT NOT NULL REFERENCES sessions (id),
    attempt INTEGER NOT NULL,
    rule TEXT NOT NULL,
    fields TEXT NOT NULL,
    sentence TEXT NOT NULL,
    digest TEXT NOT NULL,
    state TEXT NOT NULL
        CHECK (state IN ('pending', 'approved', 'declined', 'withdrawn', 'expired')),
    approver TEXT,
    decided_at TEXT,
    created_at TEXT NOT NULL,
    expires_at TEXT NOT NULL,
    received_at TEXT NOT NULL,
    decision TEXT,
    outcome TEXT
);
CREATE INDEX proposals_by_session ON proposals (session_id);
CREATE INDEX proposals_by_state ON proposals (state);
CREATE TABLE approvers (
    name TEXT PRIMARY KEY NOT NULL,
    token_sha256 TEXT UNIQUE NOT NULL,
    created_at TEXT NOT NULL
);
ALTER TABLE attempts ADD COLUMN lock TEXT NOT NULL DEFAULT '[]';
ALTER TABLE attempts ADD COLUMN relay_public_key TEXT;
"#;

/// The current time, RFC 3339 UTC with milliseconds (as the gateway's
/// records write it).
pub fn now() -> String {
    humantime::format_rfc3339_millis(SystemTime::now()).to_string()
}

/// The control stub's store.
#[derive(Debug)]
pub struct Store {
    conn: Connection,
    path: PathBuf,
}

impl Store {
    /// Open the store at `path`, creating the file (mode 0600) and the
    /// schema on first use.
    pub fn open(path: &Path) -> Result<Store, Error> {
        create_private(path)?;
        let conn = Connection::open(path)?;
        conn.busy_timeout(BUSY_TIMEOUT)?;
        let mode: String =
            conn.pragma_update_and_check(None, "journal_mode", "WAL", |r| r.get(0))?;
        if !mode.eq_ignore_ascii_case("wal") {
            return Err(Error::Store(format!(
                "{}: journal mode is {mode}, not wal",
                path.display()
            )));
        }
        conn.pragma_update(None, "synchronous", "FULL")?;
        conn.pragma_update(None, "foreign_keys", "ON")?;
        conn.pragma_update(None, "secure_delete", "ON")?;
        let mut store = Store {
            conn,
            path: path.to_owned(),
        };
        store.migrate()?;
        Ok(store)
    }

    /// The file this store lives in.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn migrate(&mut self) -> Result<(), Error> {
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)?;
        let version: i64 = tx.pragma_query_value(None, "user_version", |r| r.get(0))?;
        match version {
            0 => {
                tx.execute_batch(SCHEMA_V1)?;
                tx.execute_batch(SCHEMA_V2)?;
                tx.execute_batch(SCHEMA_V3)?;
                tx.pragma_update(None, "user_version", SCHEMA_VERSION)?;
            }
            1 => {
                tx.execute_batch(SCHEMA_V2)?;
                tx.execute_batch(SCHEMA_V3)?;
                tx.pragma_update(None, "user_version", SCHEMA_VERSION)?;
            }
            2 => {
                tx.execute_batch(SCHEMA_V3)?;
                tx.pragma_update(None, "user_version", SCHEMA_VERSION)?;
            }
            SCHEMA_VERSION => {}
            v => {
                return Err(Error::Store(format!(
                    "{}: schema version {v} is not one this control stub knows (it knows {SCHEMA_VERSION})",
                    self.path.display()
                )))
            }
        }
        tx.commit()?;
        Ok(())
    }

    /// Run `f` in a write transaction: committed when `f` returns `Ok`,
    /// rolled back when it returns `Err` (or the commit fails).
    pub fn write<T>(&mut self, f: impl FnOnce(&Tx<'_>) -> Result<T, Error>) -> Result<T, Error> {
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)?;
        let out = f(&Tx { conn: &tx })?;
        tx.commit()?;
        Ok(out)
    }

    /// Run `f` on one consistent snapshot of the store.
    pub fn read<T>(&self, f: impl FnOnce(&Tx<'_>) -> Result<T, Error>) -> Result<T, Error> {
        let tx = self.conn.unchecked_transaction()?;
        let out = f(&Tx { conn: &tx })?;
        tx.finish()?;
        Ok(out)
    }

    /// Fold the WAL into the file and truncate it, so that an old page
    /// holding a replaced or deleted secret value does not linger there.
    fn checkpoint(&self) -> Result<(), Error> {
        self.conn
            .query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))?;
        Ok(())
    }

    // ---- account policy: the egress list ----

    /// Add `name` (canonicalised) to the egress list; returns the canonical
    /// name. Adding a name already there changes nothing.
    pub fn egress_add(&mut self, name: &str) -> Result<String, Error> {
        let name = names::destination(name)?;
        self.write(|tx| {
            tx.conn.execute(
                "INSERT OR IGNORE INTO egress (name, added_at) VALUES (?1, ?2)",
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

    // ---- the secret store ----

    /// Set tenant `tenant`'s secret `name` to `value` (a new value replaces
    /// the old one). Sessions already running keep the value they opened
    /// with; the next resume or recovery reads the new one.
    pub fn secret_set(&mut self, tenant: &str, name: &str, value: &[u8]) -> Result<(), Error> {
        let tenant = names::tenant(tenant)?;
        let name = names::secret_name(name)?;
        names::secret_value(&name, value)?;
        self.write(|tx| {
            tx.conn.execute(
                "INSERT INTO secrets (tenant, name, value, updated_at) VALUES (?1, ?2, ?3, ?4)
                 ON CONFLICT (tenant, name) DO UPDATE SET value = ?3, updated_at = ?4",
                params![tenant, name, value, now()],
            )?;
            Ok(())
        })?;
        self.checkpoint()
    }

    /// Delete tenant `tenant`'s secret `name`.
    pub fn secret_delete(&mut self, tenant: &str, name: &str) -> Result<(), Error> {
        let tenant = names::tenant(tenant)?;
        let name = names::secret_name(name)?;
        self.write(|tx| {
            let n = tx.conn.execute(
                "DELETE FROM secrets WHERE tenant = ?1 AND name = ?2",
                params![tenant, name],
            )?;
            if n == 0 {
                return Err(Error::SecretNotFound {
                    tenant: tenant.clone(),
                    name: name.clone(),
                });
            }
            Ok(())
        })?;
        self.checkpoint()
    }

    /// The tenant's secrets: names and times, never values.
    pub fn secret_list(&self, tenant: &str) -> Result<Vec<SecretInfo>, Error> {
        let tenant = names::tenant(tenant)?;
        self.read(|tx| {
            let mut stmt = tx
                .conn
                .prepare("SELECT name, updated_at FROM secrets WHERE tenant = ?1 ORDER BY name")?;
            let rows = stmt.query_map(params![tenant], |r| {
                Ok(SecretInfo {
                    name: r.get(0)?,
                    updated_at: r.get(1)?,
                })
            })?;
            Ok(rows.collect::<Result<Vec<_>, _>>()?)
        })
    }

    // ---- gateways ----

    /// Register gateway `id` with its public key (hex). Registering the
    /// same key again changes nothing; another key is refused.
    pub fn register_gateway(&mut self, id: &str, public_key_hex: &str) -> Result<(), Error> {
        let id = names::gateway_id(id)?;
        if public_key_hex.is_empty()
            || !public_key_hex.len().is_multiple_of(2)
            || !public_key_hex.bytes().all(|b| b.is_ascii_hexdigit())
        {
            return Err(Error::NameInvalid {
                what: "public key",
                got: public_key_hex.chars().take(300).collect(),
                reason: "a public key is given as an even number of hex digits".into(),
            });
        }
        let key = public_key_hex.to_ascii_lowercase();
        self.write(|tx| {
            match tx.gateway_key(&id)? {
                Some(k) if k == key => {}
                Some(_) => return Err(Error::GatewayKeyConflict { gateway_id: id }),
                None => {
                    tx.conn.execute(
                        "INSERT INTO gateways (id, public_key_hex, registered_at) VALUES (?1, ?2, ?3)",
                        params![id, key, now()],
                    )?;
                }
            }
            Ok(())
        })
    }

    /// Every registered gateway.
    pub fn gateways(&self) -> Result<Vec<GatewayInfo>, Error> {
        self.read(|tx| {
            let mut stmt = tx
                .conn
                .prepare("SELECT id, public_key_hex, registered_at FROM gateways ORDER BY id")?;
            let rows = stmt.query_map([], |r| {
                Ok(GatewayInfo {
                    id: r.get(0)?,
                    public_key_hex: r.get(1)?,
                    registered_at: r.get(2)?,
                })
            })?;
            Ok(rows.collect::<Result<Vec<_>, _>>()?)
        })
    }

    // ---- account policy: the Lock ----

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

    // ---- the approvals API's approvers ----

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
            Ok(rows.collect::<Result<Vec<_>, _>>()?)
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

    // ---- the batch consumer ----

    /// Record a verified batch: its digest and its connection records.
    ///
    /// The caller has checked the batch's signature, sequence and chain.
    /// Idempotent per `(gateway_id, seq)`: the same batch again returns
    /// [`BatchOutcome::AlreadyRecorded`] and changes nothing; another digest
    /// under a recorded sequence number is `batch_conflict`. Each record's
    /// `session_id` field files it under its session (records without one,
    /// such as `unknown_source`, are kept under none).
    pub fn record_batch(
        &mut self,
        gateway_id: &str,
        seq: u64,
        digest: &str,
        records: &[serde_json::Value],
    ) -> Result<BatchOutcome, Error> {
        let gateway_id = names::gateway_id(gateway_id)?;
        self.write(|tx| tx.insert_batch(&gateway_id, seq, digest, records))
    }

    /// Verify a signed batch (signature, sequence, chain) against the
    /// registered keys and each gateway's chain position, and record the
    /// outcome, all in one transaction: a new batch with its records and
    /// the gateway's new chain position; a rejection with its reason; a
    /// duplicate changes nothing.
    pub fn accept_batch(&mut self, signed: &talos_certs::Signed) -> Result<BatchVerdict, Error> {
        self.write(|tx| {
            let mut verifier = talos_certs::ChainVerifier::new();
            let mut stmt = tx.conn.prepare(
                "SELECT g.id, g.public_key_hex, c.json FROM gateways g
                 LEFT JOIN chain_state c ON c.gateway_id = g.id",
            )?;
            let rows = stmt.query_map([], |r| {
                Ok((
                    r.get::<_, String>(0)?,
                    r.get::<_, String>(1)?,
                    r.get::<_, Option<String>>(2)?,
                ))
            })?;
            for row in rows {
                let (id, key_hex, state) = row?;
                // A registered key that is not an Ed25519 key verifies
                // nothing: its gateway's batches are refused unknown_gateway.
                let Some(key) = ed25519_key(&key_hex) else {
                    continue;
                };
                let state = match state {
                    Some(json) => serde_json::from_str(&json)?,
                    None => talos_certs::ChainState::genesis(),
                };
                verifier.register(id, key, state);
            }
            drop(stmt);
            match verifier.accept(signed) {
                Ok(talos_certs::Accepted::New {
                    header,
                    records,
                    digest,
                }) => {
                    let values = records
                        .iter()
                        .map(|r| serde_json::from_str(r))
                        .collect::<Result<Vec<serde_json::Value>, _>>()?;
                    tx.insert_batch(&header.gateway_id, header.seq, &digest, &values)?;
                    let state = verifier
                        .state(&header.gateway_id)
                        .ok_or_else(|| Error::Store("chain state lost".into()))?;
                    tx.conn.execute(
                        "INSERT INTO chain_state (gateway_id, json) VALUES (?1, ?2)
                         ON CONFLICT (gateway_id) DO UPDATE SET json = excluded.json",
                        params![header.gateway_id, serde_json::to_string(state)?],
                    )?;
                    Ok(BatchVerdict::Accepted {
                        gateway_id: header.gateway_id,
                        seq: header.seq,
                    })
                }
                Ok(talos_certs::Accepted::Duplicate { gateway_id, seq }) => {
                    Ok(BatchVerdict::Duplicate { gateway_id, seq })
                }
                Err(rejection) => {
                    let (gateway_id, seq) = claimed_header(&signed.payload);
                    let reason = rejection.as_str();
                    let gateway_id: String =
                        gateway_id.chars().take(names::MAX_GATEWAY_ID_LEN).collect();
                    tx.conn.execute(
                        "INSERT INTO batch_rejections (gateway_id, seq, reason, at) VALUES (?1, ?2, ?3, ?4)",
                        params![gateway_id, seq_to_sql(seq).unwrap_or(i64::MAX), reason, now()],
                    )?;
                    Ok(BatchVerdict::Rejected {
                        gateway_id,
                        seq,
                        reason,
                        detail: rejection.to_string(),
                    })
                }
            }
        })
    }

    /// Record that the batch consumer refused batch `seq` of `gateway_id`
    /// (bad signature, a gap or repeat in the sequence, a broken chain).
    pub fn record_rejection(
        &mut self,
        gateway_id: &str,
        seq: u64,
        reason: &str,
    ) -> Result<(), Error> {
        let seq_sql = seq_to_sql(seq)?;
        // The id is what the refused batch claimed: kept as given, bounded.
        let gateway_id: String = gateway_id.chars().take(names::MAX_GATEWAY_ID_LEN).collect();
        self.write(|tx| {
            tx.conn.execute(
                "INSERT INTO batch_rejections (gateway_id, seq, reason, at) VALUES (?1, ?2, ?3, ?4)",
                params![gateway_id, seq_sql, reason, now()],
            )?;
            Ok(())
        })
    }
}

fn seq_to_sql(seq: u64) -> Result<i64, Error> {
    i64::try_from(seq).map_err(|_| Error::Store(format!("sequence number {seq} is out of range")))
}

/// Create `path` with mode 0600 if it does not exist; refuse an existing
/// file that others may read or write.
fn create_private(path: &Path) -> Result<(), Error> {
    let err = |e: std::io::Error| Error::Store(format!("{}: {e}", path.display()));
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    match options.open(path) {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(err(e)),
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(path).map_err(err)?.permissions().mode();
        if mode & 0o077 != 0 {
            return Err(Error::Store(format!(
                "{}: mode {:o} lets others read or write the secret store; chmod 600 it",
                path.display(),
                mode & 0o777
            )));
        }
    }
    Ok(())
}

/// What [`Store::accept_batch`] made of a signed batch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BatchVerdict {
    /// Verified, new, recorded.
    Accepted { gateway_id: String, seq: u64 },
    /// Verified, and recorded before (a re-delivery).
    Duplicate { gateway_id: String, seq: u64 },
    /// Refused, and the refusal recorded. `gateway_id` and `seq` are what
    /// the batch claimed (empty and 0 when it does not parse); `reason` is
    /// the stable name ([`talos_certs::Rejection::as_str`]).
    Rejected {
        gateway_id: String,
        seq: u64,
        reason: &'static str,
        detail: String,
    },
}

/// A registered public key (hex) as an Ed25519 key, if it is one.
pub fn ed25519_key(hex_key: &str) -> Option<[u8; 32]> {
    hex::decode(hex_key).ok()?.try_into().ok()
}

pub use talos_certs::claimed_header;

/// Whether [`Store::record_batch`] recorded the batch or had it already.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum BatchOutcome {
    Recorded,
    AlreadyRecorded,
}

/// A secret as `secret list` shows it: no value.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct SecretInfo {
    pub name: String,
    pub updated_at: String,
}

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

/// A registered gateway.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct GatewayInfo {
    pub id: String,
    pub public_key_hex: String,
    pub registered_at: String,
}

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
}

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
}

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

/// A connection record from a batch.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ConnectionRecord {
    pub gateway_id: String,
    pub seq: u64,
    pub idx: u32,
    pub record: serde_json::Value,
}

/// A batch a session's records came in.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct BatchInfo {
    pub gateway_id: String,
    pub seq: u64,
    pub digest: String,
    pub received_at: String,
}

/// A refused batch.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct BatchRejection {
    pub gateway_id: String,
    pub seq: u64,
    pub reason: String,
    pub at: String,
}

fn parse_word<T>(
    idx: usize,
    text: String,
    parse: impl Fn(&str) -> Option<T>,
) -> rusqlite::Result<T> {
    parse(&text).ok_or_else(|| {
        rusqlite::Error::FromSqlConversionFailure(
            idx,
            rusqlite::types::Type::Text,
            format!("unknown word {text:?}").into(),
        )
    })
}

fn json_col<T: serde::de::DeserializeOwned>(idx: usize, text: String) -> rusqlite::Result<T> {
    serde_json::from_str(&text).map_err(|e| {
        rusqlite::Error::FromSqlConversionFailure(idx, rusqlite::types::Type::Text, Box::new(e))
    })
}

/// The store inside one transaction: every query a transition makes.
#[derive(Debug)]
pub struct Tx<'a> {
    conn: &'a Connection,
}

impl Tx<'_> {
    /// Record a verified batch (see [`Store::record_batch`]).
    pub fn insert_batch(
        &self,
        gateway_id: &str,
        seq: u64,
        digest: &str,
        records: &[serde_json::Value],
    ) -> Result<BatchOutcome, Error> {
        let seq_sql = seq_to_sql(seq)?;
        let recorded: Option<String> = self
            .conn
            .query_row(
                "SELECT digest FROM batches WHERE gateway_id = ?1 AND seq = ?2",
                params![gateway_id, seq_sql],
                |r| r.get(0),
            )
            .optional()?;
        match recorded {
            Some(d) if d == digest => return Ok(BatchOutcome::AlreadyRecorded),
            Some(d) => {
                return Err(Error::BatchConflict {
                    gateway_id: gateway_id.to_owned(),
                    seq,
                    recorded: d,
                })
            }
            None => {}
        }
        self.conn.execute(
            "INSERT INTO batches (gateway_id, seq, digest, received_at) VALUES (?1, ?2, ?3, ?4)",
            params![gateway_id, seq_sql, digest, now()],
        )?;
        let mut stmt = self.conn.prepare(
            "INSERT INTO connection_records (gateway_id, seq, idx, session_id, json)
             VALUES (?1, ?2, ?3, ?4, ?5)",
        )?;
        for (idx, record) in records.iter().enumerate() {
            let session_id = record.get("session_id").and_then(|v| v.as_str());
            let idx = i64::try_from(idx).map_err(|_| Error::Store("batch too long".into()))?;
            stmt.execute(params![
                gateway_id,
                seq_sql,
                idx,
                session_id,
                serde_json::to_string(record)?
            ])?;
        }
        Ok(BatchOutcome::Recorded)
    }

    /// The egress list, sorted.
    pub fn egress_names(&self) -> Result<Vec<String>, Error> {
        let mut stmt = self.conn.prepare("SELECT name FROM egress ORDER BY name")?;
        let rows = stmt.query_map([], |r| r.get(0))?;
        Ok(rows.collect::<Result<Vec<String>, _>>()?)
    }

    /// Whether tenant `tenant` has secret `name`.
    pub fn secret_exists(&self, tenant: &str, name: &str) -> Result<bool, Error> {
        Ok(self
            .conn
            .query_row(
                "SELECT 1 FROM secrets WHERE tenant = ?1 AND name = ?2",
                params![tenant, name],
                |_| Ok(()),
            )
            .optional()?
            .is_some())
    }

    /// The value of tenant `tenant`'s secret `name`, as stored now.
    pub fn secret_value(
        &self,
        tenant: &str,
        name: &str,
    ) -> Result<Option<Zeroizing<Vec<u8>>>, Error> {
        Ok(self
            .conn
            .query_row(
                "SELECT value FROM secrets WHERE tenant = ?1 AND name = ?2",
                params![tenant, name],
                |r| r.get::<_, Vec<u8>>(0),
            )
            .optional()?
            .map(Zeroizing::new))
    }

    /// The registered public key (hex) of gateway `id`.
    pub fn gateway_key(&self, id: &str) -> Result<Option<String>, Error> {
        Ok(self
            .conn
            .query_row(
                "SELECT public_key_hex FROM gateways WHERE id = ?1",
                params![id],
                |r| r.get(0),
            )
            .optional()?)
    }

    /// A session id no session has yet: `sbx-` and 12 random hex digits
    /// (SQLite's generator, seeded from the operating system).
    pub fn new_session_id(&self) -> Result<String, Error> {
        loop {
            let id: String =
                self.conn
                    .query_row("SELECT 'sbx-' || lower(hex(randomblob(6)))", [], |r| {
                        r.get(0)
                    })?;
            if self.session(&id)?.is_none() {
                return Ok(id);
            }
        }
    }

    pub fn insert_session(&self, s: &Session) -> Result<(), Error> {
        self.conn.execute(
            "INSERT INTO sessions (id, tenant, mode, state, created_at, ended_at, end_reason,
                                   outcome, allow, attach, sources)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)",
            params![
                s.id,
                s.tenant,
                s.mode.as_str(),
                s.state.as_str(),
                s.created_at,
                s.ended_at,
                s.end_reason.map(|r| r.as_str()),
                s.outcome,
                serde_json::to_string(&s.allow)?,
                serde_json::to_string(&s.attach)?,
                serde_json::to_string(&s.sources)?,
            ],
        )?;
        Ok(())
    }

    /// The session `id`, if there is one.
    pub fn session(&self, id: &str) -> Result<Option<Session>, Error> {
        Ok(self
            .conn
            .query_row(
                "SELECT id, tenant, mode, state, created_at, ended_at, end_reason, outcome,
                        allow, attach, sources
                 FROM sessions WHERE id = ?1",
                params![id],
                session_row,
            )
            .optional()?)
    }

    /// Sessions that have not ended.
    pub fn live_sessions(&self) -> Result<Vec<Session>, Error> {
        let mut stmt = self.conn.prepare(
            "SELECT id, tenant, mode, state, created_at, ended_at, end_reason, outcome,
                    allow, attach, sources
             FROM sessions WHERE state NOT IN ('ended', 'reset_incomplete') ORDER BY id",
        )?;
        let rows = stmt.query_map([], session_row)?;
        Ok(rows.collect::<Result<Vec<_>, _>>()?)
    }

    pub fn set_state(&self, id: &str, state: State) -> Result<(), Error> {
        self.conn.execute(
            "UPDATE sessions SET state = ?2 WHERE id = ?1",
            params![id, state.as_str()],
        )?;
        Ok(())
    }

    /// Mark the session over: its final state, why, and the outcome if any.
    pub fn set_ended(
        &self,
        id: &str,
        state: State,
        reason: EndReason,
        outcome: Option<&str>,
        at: &str,
    ) -> Result<(), Error> {
        self.conn.execute(
            "UPDATE sessions SET state = ?2, end_reason = ?3, outcome = ?4, ended_at = ?5
             WHERE id = ?1",
            params![id, state.as_str(), reason.as_str(), outcome, at],
        )?;
        Ok(())
    }

    pub fn insert_attempt(&self, session_id: &str, a: &Attempt) -> Result<(), Error> {
        self.conn.execute(
            "INSERT INTO attempts (session_id, n, cause, started_at, ended_at, end_cause,
                                   allowlist, attachments, lock, relay_public_key)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)",
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
            ],
        )?;
        Ok(())
    }

    /// The session's attempts, in order.
    pub fn attempts(&self, session_id: &str) -> Result<Vec<Attempt>, Error> {
        let mut stmt = self.conn.prepare(
            "SELECT n, cause, started_at, ended_at, end_cause, allowlist, attachments, lock,
                    relay_public_key
             FROM attempts WHERE session_id = ?1 ORDER BY n",
        )?;
        let rows = stmt.query_map(params![session_id], |r| {
            Ok(Attempt {
                n: r.get(0)?,
                cause: parse_word(1, r.get(1)?, OpenCause::parse)?,
                started_at: r.get(2)?,
                ended_at: r.get(3)?,
                end_cause: r
                    .get::<_, Option<String>>(4)?
                    .map(|t| parse_word(4, t, AttemptEnd::parse))
                    .transpose()?,
                allowlist: json_col(5, r.get(5)?)?,
                attachments: json_col(6, r.get(6)?)?,
                lock: json_col(7, r.get(7)?)?,
                relay_public_key: r.get(8)?,
            })
        })?;
        Ok(rows.collect::<Result<Vec<_>, _>>()?)
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

    /// Every connection record naming the session, by gateway, batch and
    /// position.
    pub fn connection_records(&self, session_id: &str) -> Result<Vec<ConnectionRecord>, Error> {
        let mut stmt = self.conn.prepare(
            "SELECT gateway_id, seq, idx, json FROM connection_records
             WHERE session_id = ?1 ORDER BY gateway_id, seq, idx",
        )?;
        let rows = stmt.query_map(params![session_id], |r| {
            Ok(ConnectionRecord {
                gateway_id: r.get(0)?,
                seq: get_u64(r, 1)?,
                idx: r.get(2)?,
                record: json_col(3, r.get(3)?)?,
            })
        })?;
        Ok(rows.collect::<Result<Vec<_>, _>>()?)
    }

    /// The batches that carried records of the session.
    pub fn batches_of(&self, session_id: &str) -> Result<Vec<BatchInfo>, Error> {
        let mut stmt = self.conn.prepare(
            "SELECT gateway_id, seq, digest, received_at FROM batches b
             WHERE EXISTS (SELECT 1 FROM connection_records c
                           WHERE c.gateway_id = b.gateway_id AND c.seq = b.seq
                             AND c.session_id = ?1)
             ORDER BY gateway_id, seq",
        )?;
        let rows = stmt.query_map(params![session_id], |r| {
            Ok(BatchInfo {
                gateway_id: r.get(0)?,
                seq: get_u64(r, 1)?,
                digest: r.get(2)?,
                received_at: r.get(3)?,
            })
        })?;
        Ok(rows.collect::<Result<Vec<_>, _>>()?)
    }

    /// Every refused batch from these gateways.
    pub fn batch_rejections(&self, gateway_ids: &[String]) -> Result<Vec<BatchRejection>, Error> {
        let mut stmt = self.conn.prepare(
            "SELECT gateway_id, seq, reason, at FROM batch_rejections
             WHERE gateway_id = ?1 ORDER BY rowid",
        )?;
        let mut out = Vec::new();
        for g in gateway_ids {
            let rows = stmt.query_map(params![g], |r| {
                Ok(BatchRejection {
                    gateway_id: r.get(0)?,
                    seq: get_u64(r, 1)?,
                    reason: r.get(2)?,
                    at: r.get(3)?,
                })
            })?;
            for row in rows {
                out.push(row?);
            }
        }
        Ok(out)
    }
}

/// A non-negative integer column (SQLite stores signed 64-bit integers).
fn get_u64(r: &rusqlite::Row<'_>, idx: usize) -> rusqlite::Result<u64> {
    let v: i64 = r.get(idx)?;
    u64::try_from(v).map_err(|e| {
        rusqlite::Error::FromSqlConversionFailure(idx, rusqlite::types::Type::Integer, Box::new(e))
    })
}

fn session_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<Session> {
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
    })
}

const PROPOSAL_COLUMNS: &str =
    "proposal_id, gateway_id, session_id, attempt, rule, fields, sentence,
     digest, state, approver, decided_at, created_at, expires_at, received_at, decision, outcome";

fn proposal_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<ProposalRecord> {
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

fn lock_rule_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<LockRule> {
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

const LOCK_COLUMNS: &str =
    "id, destination, attachment, method, path_prefix, mode, approvers, created_at";

/// The Lock and the relay, inside one transaction.
impl Tx<'_> {
    /// Add a rule; its id is `lock-N`, N never used before.
    pub fn insert_lock_rule(&self, rule: &NewRule) -> Result<LockRule, Error> {
        let created_at = now();
        // The row gets its number first; the id is made from it.
        self.conn.execute(
            "INSERT INTO lock_rules (id, destination, attachment, method, path_prefix, mode,
                                     approvers, created_at)
             VALUES ('new-' || lower(hex(randomblob(8))), ?1, ?2, ?3, ?4, ?5, ?6, ?7)",
            params![
                rule.destination,
                rule.attachment,
                rule.method,
                rule.path_prefix,
                rule.mode.as_str(),
                serde_json::to_string(&rule.approvers)?,
                created_at,
            ],
        )?;
        let n = self.conn.last_insert_rowid();
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
        Ok(rows.collect::<Result<Vec<_>, _>>()?)
    }

    /// Rule `id`, if it exists.
    pub fn lock_rule(&self, id: &str) -> Result<Option<LockRule>, Error> {
        Ok(self
            .conn
            .query_row(
                &format!("SELECT {LOCK_COLUMNS} FROM lock_rules WHERE id = ?1"),
                params![id],
                lock_rule_row,
            )
            .optional()?)
    }

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
        Ok(self
            .conn
            .query_row(
                &format!("SELECT {PROPOSAL_COLUMNS} FROM proposals WHERE proposal_id = ?1"),
                params![id],
                proposal_row,
            )
            .optional()?)
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
             WHERE (?1 IS NULL OR session_id = ?1) AND (?2 IS NULL OR state = ?2)
             ORDER BY rowid"
        ))?;
        let rows = stmt.query_map(
            params![session_id, state.map(ProposalState::as_str)],
            proposal_row,
        )?;
        Ok(rows.collect::<Result<Vec<_>, _>>()?)
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
        Ok(self.conn.execute(
            "UPDATE proposals SET state = 'withdrawn', decided_at = ?2
             WHERE session_id = ?1 AND state = 'pending'",
            params![session_id, at],
        )?)
    }

    /// The approver whose token has this SHA-256 (hex), if any.
    pub fn approver_by_token(&self, token_sha256: &str) -> Result<Option<String>, Error> {
        Ok(self
            .conn
            .query_row(
                "SELECT name FROM approvers WHERE token_sha256 = ?1",
                params![token_sha256],
                |r| r.get(0),
            )
            .optional()?)
    }
}
