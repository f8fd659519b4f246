//! The SQLite side of the store: its file, created private, in WAL mode
//! with `synchronous = FULL`, `foreign_keys` and `secure_delete` on, its
//! schema brought up to date; and what its errors may say.

use std::path::Path;

use rusqlite::Connection;

use super::schema;
use super::write_lock::BUSY_TIMEOUT;
use crate::error::Error;

/// Open the store's SQLite file at `path`: created mode 0600 with its
/// schema on first use, upgraded in place when older.
pub(super) fn open(path: &Path) -> Result<Connection, Error> {
    create_private(path)?;
    let mut conn = Connection::open(path)?;
    conn.busy_timeout(BUSY_TIMEOUT)?;
    let mode: String = conn.pragma_update_and_check(None, "journal_mode", "WAL", |r| r.get(0))?;
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
    Ok(conn)
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

impl From<rusqlite::Error> for Error {
    fn from(e: rusqlite::Error) -> Error {
        // SQLite's messages name tables and constraints, never bound values.
        Error::Store(e.to_string())
    }
}
