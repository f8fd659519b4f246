//! The store itself: where it lives ([`Db`]), opened ([`Store::open`]: a
//! SQLite file, `sqlite.rs`, or a PostgreSQL database that several `serve`
//! replicas share, `pg.rs`), then read and written one transaction at a
//! time ([`Store::write`], [`Store::read`], [`Tx`]); and the one way every
//! table's code talks to it ([`Conn`]), whichever database it is.
//!
//! # One dialect for both
//!
//! Every statement is written once, in the SQL both databases take:
//! numbered parameters (`?1`; given to PostgreSQL as `$1`), `ON CONFLICT`
//! for an insert that may meet its row, `RETURNING` for a generated key,
//! `rowid` for insertion order (SQLite's own; a column of that name in
//! PostgreSQL's tables), and a few functions that differ by name only
//! ([`Conn::dialect`]). Values cross as four kinds ([`Value`]: integers,
//! text, bytes and NULL; `value.rs`).
//!
//! # Writers take turns
//!
//! A write transaction holds the database's one write lock from its first
//! statement to its commit (`write_lock.rs`), so a transition decided in a
//! write transaction was decided on the latest committed state. A read is
//! one consistent snapshot.

use std::cell::RefCell;
use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use rusqlite::{Connection, TransactionBehavior};

use super::pg::{redact_url, Pg, PgTx};
use super::value::{
    check_params, from_pg_row, from_sqlite, pg_params, pg_refs, sqlite_value, Row, RowError, Value,
};
use super::{schema, sqlite, write_lock};
use crate::error::Error;

/// Where the CLI keeps its store unless `--db` says otherwise.
pub const DEFAULT_PATH: &str = "./control-stub.db";

/// The current time, RFC 3339 UTC with milliseconds (as the gateway's
/// records write it).
pub fn now() -> String {
    humantime::format_rfc3339_millis(SystemTime::now()).to_string()
}

/// Where a store lives: a SQLite file (the default: one process, nothing to
/// install), or a PostgreSQL database (`postgres://USER[:PASSWORD]@HOST[:PORT]/DB`,
/// the password also from `PGPASSWORD`), which several `serve` replicas
/// share.
#[derive(Clone, PartialEq, Eq)]
pub enum Db {
    File(PathBuf),
    Postgres(String),
}

impl Db {
    /// `--db`'s text: a `postgres://` or `postgresql://` URL, or a path.
    pub fn parse(text: &str) -> Db {
        if text.starts_with("postgres://") || text.starts_with("postgresql://") {
            Db::Postgres(text.to_owned())
        } else {
            Db::File(PathBuf::from(text))
        }
    }

    /// Whether there may be a store here already: a file that exists, or
    /// any database (it is asked when opened).
    pub fn exists(&self) -> bool {
        match self {
            Db::File(p) => p.exists(),
            Db::Postgres(_) => true,
        }
    }

    /// The text `--db` takes for this store, password and all (for a
    /// child process's command line; never logged: [`Db`]'s `Display`
    /// hides the password).
    pub fn as_arg(&self) -> std::ffi::OsString {
        match self {
            Db::File(p) => p.as_os_str().to_owned(),
            Db::Postgres(url) => url.into(),
        }
    }

    /// Which database this is, for the store's metrics and logs.
    pub fn kind(&self) -> &'static str {
        match self {
            Db::File(_) => "sqlite",
            Db::Postgres(_) => "postgres",
        }
    }
}

/// Shown with any password in a URL as `***`: a store's location is logged
/// and printed, its password never.
impl fmt::Display for Db {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Db::File(p) => write!(f, "{}", p.display()),
            Db::Postgres(url) => f.write_str(&redact_url(url)),
        }
    }
}

impl fmt::Debug for Db {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{self}")
    }
}

impl std::str::FromStr for Db {
    type Err = std::convert::Infallible;
    fn from_str(s: &str) -> Result<Db, Self::Err> {
        Ok(Db::parse(s))
    }
}

impl From<&Path> for Db {
    fn from(p: &Path) -> Db {
        Db::File(p.to_owned())
    }
}

impl From<&PathBuf> for Db {
    fn from(p: &PathBuf) -> Db {
        Db::File(p.clone())
    }
}

impl From<PathBuf> for Db {
    fn from(p: PathBuf) -> Db {
        Db::File(p)
    }
}

impl From<&Db> for Db {
    fn from(d: &Db) -> Db {
        d.clone()
    }
}

/// The control stub's store.
#[derive(Debug)]
pub struct Store {
    backend: Backend,
    db: Db,
}

enum Backend {
    Sqlite(Connection),
    Postgres(RefCell<Box<Pg>>),
}

impl fmt::Debug for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Backend::Sqlite(_) => "Sqlite",
            Backend::Postgres(_) => "Postgres",
        })
    }
}

impl Store {
    /// Open the store at `db`: a SQLite file (created, mode 0600, with its
    /// schema on first use) or a PostgreSQL database (its schema created on
    /// first use, under a lock, so replicas starting at once make it once).
    pub fn open(db: impl Into<Db>) -> Result<Store, Error> {
        let db = db.into();
        let backend = match &db {
            Db::File(path) => Backend::Sqlite(sqlite::open(path)?),
            Db::Postgres(url) => {
                let mut pg = Pg::connect(url)?;
                schema::migrate_postgres(pg.client()?, &db)?;
                Backend::Postgres(RefCell::new(Box::new(pg)))
            }
        };
        Ok(Store { backend, db })
    }

    /// Where this store lives.
    pub fn db(&self) -> &Db {
        &self.db
    }

    /// Where this store lives, shown as it is logged (a URL's password
    /// never).
    pub fn path(&self) -> String {
        self.db.to_string()
    }

    /// Run `f` in a write transaction: committed when `f` returns `Ok`,
    /// rolled back when it returns `Err` (or the commit fails).
    pub fn write<T>(&mut self, f: impl FnOnce(&Tx<'_>) -> Result<T, Error>) -> Result<T, Error> {
        match &mut self.backend {
            Backend::Sqlite(conn) => {
                let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
                let out = f(&Tx::sqlite(&tx))?;
                tx.commit()?;
                Ok(out)
            }
            Backend::Postgres(pg) => {
                let mut pg = pg.borrow_mut();
                let (client, statements) = pg.parts()?;
                let mut tx = client.transaction()?;
                write_lock::take(&mut tx)?;
                let t = Tx::postgres(tx, statements);
                let out = f(&t)?;
                t.into_pg().commit()?;
                Ok(out)
            }
        }
    }

    /// Run `f` in a write transaction if the write lock is free now;
    /// `None`, with nothing written, if another writer holds it. For
    /// bookkeeping that the next round writes again (when a member was
    /// last seen): a loop that keeps leases alive never waits behind
    /// another replica's writers. With PostgreSQL that can be long: a
    /// replica frozen (SIGSTOP, a paused VM) with several connections
    /// queued for the lock holds it once per connection, each time until
    /// the database ends that connection's idle transaction
    /// (`IDLE_IN_TRANSACTION`, 5 s). SQLite's lock is one process's at a
    /// time, and this waits as [`Store::write`] does.
    pub fn try_write<T>(
        &mut self,
        f: impl FnOnce(&Tx<'_>) -> Result<T, Error>,
    ) -> Result<Option<T>, Error> {
        match &mut self.backend {
            Backend::Sqlite(_) => self.write(f).map(Some),
            Backend::Postgres(pg) => {
                let mut pg = pg.borrow_mut();
                let (client, statements) = pg.parts()?;
                let mut tx = client.transaction()?;
                if !write_lock::try_take(&mut tx)? {
                    tx.rollback()?;
                    return Ok(None);
                }
                let t = Tx::postgres(tx, statements);
                let out = f(&t)?;
                t.into_pg().commit()?;
                Ok(Some(out))
            }
        }
    }

    /// Run `f` on one consistent snapshot of the store.
    pub fn read<T>(&self, f: impl FnOnce(&Tx<'_>) -> Result<T, Error>) -> Result<T, Error> {
        match &self.backend {
            Backend::Sqlite(conn) => {
                let tx = conn.unchecked_transaction()?;
                let out = f(&Tx::sqlite(&tx))?;
                tx.finish()?;
                Ok(out)
            }
            Backend::Postgres(pg) => {
                let mut pg = pg.borrow_mut();
                let (client, statements) = pg.parts()?;
                let tx = client
                    .build_transaction()
                    .isolation_level(postgres::IsolationLevel::RepeatableRead)
                    .read_only(true)
                    .start()?;
                let t = Tx::postgres(tx, statements);
                let out = f(&t)?;
                t.into_pg().commit()?;
                Ok(out)
            }
        }
    }

    /// Fold the WAL into the file and truncate it, so that an old page
    /// holding a replaced or deleted secret value does not linger there.
    /// (PostgreSQL keeps an old row version until it is vacuumed: a change
    /// to a secret vacuums the table, see `secrets.rs`.)
    pub(super) fn checkpoint(&mut self) -> Result<(), Error> {
        match &mut self.backend {
            Backend::Sqlite(conn) => {
                conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))?;
            }
            Backend::Postgres(pg) => {
                pg.borrow_mut().client()?.batch_execute("VACUUM secrets")?;
            }
        }
        Ok(())
    }
}

/// The store inside one transaction: every query a transition makes.
#[derive(Debug)]
pub struct Tx<'a> {
    pub(super) conn: Conn<'a>,
}

impl<'a> Tx<'a> {
    fn sqlite(conn: &'a Connection) -> Tx<'a> {
        Tx {
            conn: Conn::Sqlite(conn),
        }
    }

    fn postgres(
        tx: postgres::Transaction<'a>,
        statements: &'a mut HashMap<String, postgres::Statement>,
    ) -> Tx<'a> {
        Tx {
            conn: Conn::Postgres(RefCell::new(PgTx { tx, statements })),
        }
    }

    fn into_pg(self) -> postgres::Transaction<'a> {
        match self.conn {
            Conn::Postgres(cell) => cell.into_inner().tx,
            Conn::Sqlite(_) => unreachable_backend(),
        }
    }
}

#[allow(clippy::panic)]
fn unreachable_backend() -> ! {
    panic!("a transaction changed its database")
}

/// One transaction's connection, whichever database: the statements of
/// every table run through it.
pub(super) enum Conn<'a> {
    Sqlite(&'a Connection),
    Postgres(RefCell<PgTx<'a>>),
}

impl fmt::Debug for Conn<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Conn::Sqlite(_) => "Conn::Sqlite",
            Conn::Postgres(_) => "Conn::Postgres",
        })
    }
}

/// What differs between the two databases by name only.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Dialect {
    Sqlite,
    Postgres,
}

impl Dialect {
    /// The text of `expr` over a group, joined by `sep` (a literal).
    pub(super) fn string_agg(self, expr: &str, sep: &str) -> String {
        match self {
            Dialect::Sqlite => format!("group_concat({expr}, '{sep}')"),
            Dialect::Postgres => format!("string_agg({expr}, '{sep}')"),
        }
    }

    /// Whether the JSON array of strings in column `col` holds the text
    /// parameter `param` (`?N`).
    pub(super) fn json_array_contains(self, col: &str, param: &str) -> String {
        match self {
            Dialect::Sqlite => {
                format!("EXISTS (SELECT 1 FROM json_each({col}) WHERE value = {param})")
            }
            Dialect::Postgres => format!("({col})::jsonb ? {param}"),
        }
    }
}

/// A statement to run on [`Conn`], as `prepare` gives it.
#[derive(Debug)]
pub(super) struct Stmt<'c, 'a> {
    conn: &'c Conn<'a>,
    sql: String,
}

impl Stmt<'_, '_> {
    /// Run it as [`Conn::execute`] does.
    pub(super) fn execute<P: AsRef<[Value]>>(&mut self, params: P) -> Result<usize, Error> {
        self.conn.execute(&self.sql, params)
    }

    /// Every row, each made by `f`.
    pub(super) fn query_map<T, P: AsRef<[Value]>>(
        &mut self,
        params: P,
        f: impl FnMut(&Row) -> Result<T, Error>,
    ) -> Result<std::vec::IntoIter<Result<T, Error>>, Error> {
        let rows = self.conn.rows(&self.sql, params.as_ref())?;
        Ok(rows.iter().map(f).collect::<Vec<_>>().into_iter())
    }
}

impl<'a> Conn<'a> {
    /// The names that differ between the two databases.
    pub(super) fn dialect(&self) -> Dialect {
        match self {
            Conn::Sqlite(_) => Dialect::Sqlite,
            Conn::Postgres(_) => Dialect::Postgres,
        }
    }

    /// Run a statement that returns no rows; how many rows it changed.
    pub(super) fn execute<P: AsRef<[Value]>>(&self, sql: &str, params: P) -> Result<usize, Error> {
        let params = params.as_ref();
        check_params(params)?;
        match self {
            Conn::Sqlite(c) => {
                let mut stmt = c.prepare(sql)?;
                Ok(stmt.execute(rusqlite::params_from_iter(params.iter().map(sqlite_value)))?)
            }
            Conn::Postgres(cell) => {
                let mut pg = cell.borrow_mut();
                let stmt = pg.prepare(sql)?;
                let values = pg_params(params);
                let n = pg.tx.execute(&stmt, &pg_refs(&values))?;
                Ok(usize::try_from(n).unwrap_or(usize::MAX))
            }
        }
    }

    /// Run a query that returns one row, made by `f`.
    pub(super) fn query_row<T, P: AsRef<[Value]>>(
        &self,
        sql: &str,
        params: P,
        mut f: impl FnMut(&Row) -> Result<T, Error>,
    ) -> Result<T, RowError> {
        let rows = self.rows(sql, params.as_ref())?;
        match rows.first() {
            Some(row) => Ok(f(row)?),
            None => Err(RowError::NoRows),
        }
    }

    /// A statement to run with [`Stmt::query_map`].
    pub(super) fn prepare<'c>(&'c self, sql: &str) -> Result<Stmt<'c, 'a>, Error> {
        Ok(Stmt {
            conn: self,
            sql: sql.to_owned(),
        })
    }

    fn rows(&self, sql: &str, params: &[Value]) -> Result<Vec<Row>, Error> {
        check_params(params)?;
        match self {
            Conn::Sqlite(c) => {
                let mut stmt = c.prepare(sql)?;
                let width = stmt.column_count();
                let mut rows =
                    stmt.query(rusqlite::params_from_iter(params.iter().map(sqlite_value)))?;
                let mut out = Vec::new();
                while let Some(r) = rows.next()? {
                    let mut values = Vec::with_capacity(width);
                    for i in 0..width {
                        values.push(from_sqlite(r.get_ref(i)?));
                    }
                    out.push(Row { values });
                }
                Ok(out)
            }
            Conn::Postgres(cell) => {
                let mut pg = cell.borrow_mut();
                let stmt = pg.prepare(sql)?;
                let values = pg_params(params);
                let rows = pg.tx.query(&stmt, &pg_refs(&values))?;
                rows.iter().map(from_pg_row).collect()
            }
        }
    }
}

/// `bytes` random bytes from the operating system's generator, in hex.
pub(super) fn random_hex(bytes: usize) -> Result<String, Error> {
    let mut buf = vec![0u8; bytes];
    aws_lc_rs::rand::fill(&mut buf)
        .map_err(|_| Error::Store("the random generator failed".into()))?;
    Ok(hex::encode(buf))
}

/// Statements of a test's own on whichever database the store is, for
/// tests that set up or look at what no command does (an old activity
/// time, a row count, every row).
#[cfg(feature = "test-util")]
impl Store {
    /// Run one statement (`?N` parameters) in a write transaction.
    pub fn test_execute(&mut self, sql: &str, params: &[Value]) -> Result<usize, Error> {
        self.write(|tx| tx.conn.execute(sql, params))
    }

    /// Every row of a query (`?N` parameters), as values.
    pub fn test_query(&self, sql: &str, params: &[Value]) -> Result<Vec<Vec<Value>>, Error> {
        self.read(|tx| {
            Ok(tx
                .conn
                .rows(sql, params)?
                .into_iter()
                .map(|r| r.values)
                .collect())
        })
    }

    /// One integer a query returns.
    pub fn test_i64(&self, sql: &str) -> Result<i64, Error> {
        self.read(|tx| {
            tx.conn
                .query_row(sql, [], |r| r.get(0))
                .map_err(Error::from)
        })
    }

    /// Every row of every table, and the schema version, as text: two
    /// dumps are equal exactly when nothing changed.
    pub fn test_dump(&self) -> Result<String, Error> {
        self.read(|tx| {
            let mut out = String::new();
            let tables: Vec<String> = match tx.conn.dialect() {
                Dialect::Sqlite => {
                    let v: i64 = tx.conn.query_row("PRAGMA user_version", [], |r| r.get(0))?;
                    out.push_str(&format!("version {v}\n"));
                    tx.conn
                        .rows(
                            "SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name",
                            &[],
                        )?
                        .iter()
                        .map(|r| r.get(0))
                        .collect::<Result<_, _>>()?
                }
                Dialect::Postgres => {
                    let v: i64 =
                        tx.conn
                            .query_row("SELECT version FROM schema_version", [], |r| r.get(0))?;
                    out.push_str(&format!("version {v}\n"));
                    tx.conn
                        .rows(
                            "SELECT table_name::text FROM information_schema.tables
                             WHERE table_schema = current_schema() ORDER BY 1",
                            &[],
                        )?
                        .iter()
                        .map(|r| r.get(0))
                        .collect::<Result<_, _>>()?
                }
            };
            for table in tables {
                out.push_str(&format!("table {table}\n"));
                let sql = match tx.conn.dialect() {
                    Dialect::Sqlite => format!("SELECT * FROM \"{table}\" ORDER BY rowid"),
                    Dialect::Postgres => {
                        format!("SELECT t::text FROM \"{table}\" t ORDER BY 1")
                    }
                };
                for row in tx.conn.rows(&sql, &[])? {
                    let values: Vec<String> = row.values.iter().map(|v| format!("{v:?}")).collect();
                    out.push_str(&values.join(" | "));
                    out.push('\n');
                }
            }
            Ok(out)
        })
    }

    /// Each table's columns, `table.column type`, sorted: what the two
    /// databases' schemas are compared by.
    pub fn test_columns(&self) -> Result<Vec<String>, Error> {
        self.read(|tx| {
            let sql = match tx.conn.dialect() {
                Dialect::Sqlite => {
                    "SELECT m.name || '.' || p.name || ' ' || upper(p.type)
                     FROM sqlite_master m, pragma_table_info(m.name) p
                     WHERE m.type = 'table' AND m.name NOT LIKE 'sqlite_%'"
                }
                Dialect::Postgres => {
                    "SELECT (table_name || '.' || column_name || ' ' ||
                             CASE data_type WHEN 'bigint' THEN 'INTEGER'
                                            WHEN 'bytea' THEN 'BLOB'
                                            ELSE upper(data_type) END)::text
                     FROM information_schema.columns
                     WHERE table_schema = current_schema()
                       AND table_name <> 'schema_version' AND column_name <> 'rowid'"
                }
            };
            let mut cols: Vec<String> = tx
                .conn
                .rows(sql, &[])?
                .iter()
                .map(|r| r.get(0))
                .collect::<Result<_, _>>()?;
            cols.sort();
            Ok(cols)
        })
    }
}

#[cfg(feature = "test-util")]
impl Store {
    /// In one write transaction: run `sql`, then `during` (a freeze, say),
    /// then commit.
    pub fn test_write_during(&mut self, sql: &str, during: impl FnOnce()) -> Result<(), Error> {
        self.write(|tx| {
            tx.conn.execute(sql, [])?;
            during();
            Ok(())
        })
    }

    /// In one write transaction: read one value, then write what `f`
    /// makes of it (as `?1`). What a lost update would show.
    pub fn test_read_modify_write(
        &mut self,
        read: &str,
        write: &str,
        f: impl FnOnce(Value) -> Value,
    ) -> Result<(), Error> {
        self.write(|tx| {
            let v: Value = tx.conn.query_row(read, [], |r| r.get(0))?;
            tx.conn.execute(write, [f(v)])?;
            Ok(())
        })
    }
}
