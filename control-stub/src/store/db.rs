//! The store's file and its transactions: opened (mode 0600, WAL, the
//! pragmas, the schema brought up to date), then read and written one
//! transaction at a time; and the column helpers every table shares.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use rusqlite::{Connection, TransactionBehavior};

use super::schema;
use crate::error::Error;

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
        let mut conn = Connection::open(path)?;
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
        schema::migrate(&mut conn, path)?;
        Ok(Store {
            conn,
            path: path.to_owned(),
        })
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
    pub(super) fn checkpoint(&self) -> Result<(), Error> {
        self.conn
            .query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))?;
        Ok(())
    }
}

/// The store inside one transaction: every query a transition makes.
#[derive(Debug)]
pub struct Tx<'a> {
    pub(super) conn: &'a Connection,
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

pub(super) fn parse_word<T>(
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

pub(super) fn json_col<T: serde::de::DeserializeOwned>(
    idx: usize,
    text: String,
) -> rusqlite::Result<T> {
    serde_json::from_str(&text).map_err(|e| {
        rusqlite::Error::FromSqlConversionFailure(idx, rusqlite::types::Type::Text, Box::new(e))
    })
}
