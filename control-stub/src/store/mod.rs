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
//!
//! # Layout
//!
//! One [`Store`] (and its [`Tx`] inside a transaction), opened here; its
//! methods stand with the tables they touch, one file each:
//!
//! - `schema`: the schema version, each version's tables, the upgrade.
//! - `sessions`: sessions and their attempts.
//! - `reset`: the CAs, the drop reports and the reset steps.
//! - `secrets`: the secret store.
//! - `policy`: the egress list and the Lock's rules.
//! - `gateways`: the registered gateways and their keys.
//! - `batches`: batches, their connection records, refused batches, the
//!   chain positions.
//! - `approvals`: the approvers and the relay's proposals.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use rusqlite::{Connection, TransactionBehavior};

use crate::error::Error;

mod schema;
mod sessions;
mod reset;
mod secrets;
mod policy;
mod gateways;
mod batches;
mod approvals;

pub use approvals::{ApproverInfo, ProposalRecord};
pub use batches::{BatchInfo, BatchOutcome, BatchRejection, ChainPosition, ConnectionRecord};
pub use gateways::{ed25519_key, GatewayInfo};
pub use reset::{CaEvent, DropReport, ResetStep};
pub use schema::SCHEMA_VERSION;
pub use secrets::SecretInfo;
pub use sessions::{Attempt, Session};

/// Where the CLI keeps its store unless `--db` says otherwise.
pub const DEFAULT_PATH: &str = "./control-stub.db";

/// How long a write waits for another process's write to finish. A
/// transition holds the write lock while it talks to the gateways, so this
/// is longer than one control-channel round trip should ever take.
pub const BUSY_TIMEOUT: Duration = Duration::from_secs(10);

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
}

/// The store inside one transaction: every query a transition makes.
#[derive(Debug)]
pub struct Tx<'a> {
    conn: &'a Connection,
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
