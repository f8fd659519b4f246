//! The store's one write lock: writers take turns.
//!
//! A write transaction holds the database's one write lock from its first
//! statement to its commit: SQLite's `BEGIN IMMEDIATE` (the file's own
//! lock), and in PostgreSQL a transaction-scoped advisory lock every
//! writer takes first ([`take`]), the schema's creation and upgrade
//! included. So a transition decided in a write transaction was decided on
//! the latest committed state, and two replicas can never both decide the
//! same event: the second finds it done. A read is one consistent snapshot
//! (SQLite's transaction, PostgreSQL's `REPEATABLE READ READ ONLY`) and
//! takes no lock.

use std::time::Duration;

use crate::error::Error;

/// How long a write waits for another process's write to finish. A
/// transition holds the write lock while it talks to the gateways, so this
/// is longer than one control-channel round trip should ever take.
pub const BUSY_TIMEOUT: Duration = Duration::from_secs(10);

/// The advisory lock every PostgreSQL write transaction takes first (an
/// arbitrary constant: "TALOS" in ASCII), so writers take turns as SQLite's
/// do.
pub(super) const WRITE_LOCK: i64 = 0x54_41_4c_4f_53;

/// Take the write lock in PostgreSQL transaction `tx`, waiting for it (at
/// most the connection's `lock_timeout`, [`BUSY_TIMEOUT`]); it is let go
/// at the transaction's end, commit or rollback.
pub(super) fn take(tx: &mut postgres::Transaction<'_>) -> Result<(), Error> {
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&WRITE_LOCK])?;
    Ok(())
}

/// Take the write lock in `tx` if it is free now; whether it was.
pub(super) fn try_take(tx: &mut postgres::Transaction<'_>) -> Result<bool, Error> {
    let row = tx.query_one("SELECT pg_try_advisory_xact_lock($1)", &[&WRITE_LOCK])?;
    Ok(row.try_get(0)?)
}
