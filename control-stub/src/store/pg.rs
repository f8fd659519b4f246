//! The PostgreSQL side of the store: what its errors may say.

use crate::error::Error;

/// PostgreSQL's word on an error: its code and message, never its detail
/// (a failing row's values may be in it).
pub(super) fn pg_message(e: &postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => format!("{} ({})", db.message(), db.code().code()),
        None => {
            // The client's own errors (closed, timed out, I/O) carry no row.
            let text = e.to_string();
            text.chars().take(300).collect()
        }
    }
}

impl From<postgres::Error> for Error {
    fn from(e: postgres::Error) -> Error {
        // The code and message only: a constraint's detail may quote the
        // failing row, values and all.
        Error::Store(format!("PostgreSQL: {}", pg_message(&e)))
    }
}
