//! The store's database and its transactions: opened (a SQLite file, or a
//! PostgreSQL database that several `serve` replicas share), its schema
//! brought up to date, then read and written one transaction at a time;
//! and the one way every table's code talks to it ([`Conn`]), whichever
//! database it is.
//!
//! # One dialect for both
//!
//! Every statement is written once, in the SQL both databases take:
//! numbered parameters (`?1`; given to PostgreSQL as `$1`), `ON CONFLICT`
//! for an insert that may meet its row, `RETURNING` for a generated key,
//! `rowid` for insertion order (SQLite's own; a column of that name in
//! PostgreSQL's tables), and a few functions that differ by name only
//! ([`Conn::dialect`]). Values cross as four kinds ([`Value`]): integers,
//! text, bytes and NULL.
//!
//! # Writers take turns
//!
//! A write transaction holds the database's one write lock from its first
//! statement to its commit: SQLite's `BEGIN IMMEDIATE`, and in PostgreSQL a
//! transaction-scoped advisory lock every writer takes first. So a
//! transition decided in a write transaction was decided on the latest
//! committed state, and two replicas can never both decide the same event:
//! the second finds it done. A read is one consistent snapshot (SQLite's
//! transaction, PostgreSQL's `REPEATABLE READ READ ONLY`).

use std::cell::RefCell;
use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
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

/// How long one statement may run on PostgreSQL before it is cancelled: a
/// hung database must give a replica an error, not hold it for ever.
const STATEMENT_TIMEOUT: Duration = Duration::from_secs(30);

/// How long a PostgreSQL transaction may sit between two statements before
/// the database ends its session: a replica frozen inside a transaction
/// (SIGSTOP, a VM paused) loses it, so its write lock goes to the others
/// and whatever it decided before the freeze is never committed (its
/// commit finds the connection gone). No transaction here waits on
/// anything but the database: no member is called inside one
/// ([`crate::lifecycle`]).
const IDLE_IN_TRANSACTION: Duration = Duration::from_secs(5);

/// How long a connection to PostgreSQL may take to open.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// The advisory lock every PostgreSQL write transaction takes first (an
/// arbitrary constant: "TALOS" in ASCII), so writers take turns as SQLite's
/// do.
pub(super) const WRITE_LOCK: i64 = 0x54_41_4c_4f_53;

/// Prepared statements kept per PostgreSQL connection: the store has fewer
/// than this many distinct statements, so each is prepared once.
const STATEMENT_CACHE: usize = 512;

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

/// `url` with the password between `:` and `@` of its authority replaced.
fn redact_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return "postgres://(unreadable)".into();
    };
    let end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(end);
    match authority.rsplit_once('@') {
        Some((userinfo, host)) => match userinfo.split_once(':') {
            Some((user, _)) => format!("{scheme}://{user}:***@{host}{tail}"),
            None => url.to_owned(),
        },
        None => url.to_owned(),
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

/// One connection to PostgreSQL, made again when the database dropped it
/// (a restart, a failover), and its prepared statements.
struct Pg {
    config: postgres::Config,
    /// TLS to the database; none only for one on this host.
    tls: Option<tokio_postgres_rustls::MakeRustlsConnect>,
    client: Option<postgres::Client>,
    statements: HashMap<String, postgres::Statement>,
}

impl Pg {
    fn connect(url: &str) -> Result<Pg, Error> {
        let shown = redact_url(url);
        let (url, root_file) = take_param(url, "sslrootcert");
        let mut config: postgres::Config = url.parse().map_err(|e: postgres::Error| {
            Error::Store(format!("{shown}: not a PostgreSQL URL: {e}"))
        })?;
        if config.get_password().is_none() {
            if let Ok(pw) = std::env::var("PGPASSWORD") {
                config.password(pw);
            }
        }
        config.connect_timeout(CONNECT_TIMEOUT);
        config.keepalives(true);
        config.application_name("control-stub");
        let tls = tls_for(&mut config, url.contains("sslmode="), root_file.as_deref())
            .map_err(|e| Error::Store(format!("{shown}: {e}")))?;
        let mut pg = Pg {
            config,
            tls,
            client: None,
            statements: HashMap::new(),
        };
        pg.client()?;
        Ok(pg)
    }

    /// The connection, opened again if the database closed it.
    fn client(&mut self) -> Result<&mut postgres::Client, Error> {
        if self.client.as_ref().is_none_or(|c| c.is_closed()) {
            self.client = None;
            self.statements.clear();
            let connected = match &self.tls {
                Some(tls) => self.config.connect(tls.clone()),
                None => self.config.connect(postgres::NoTls),
            };
            let mut client = connected
                .map_err(|e| Error::Store(format!("PostgreSQL unreachable: {}", pg_message(&e))))?;
            client
                .batch_execute(&format!(
                    "SET lock_timeout = {}; SET statement_timeout = {};
                     SET idle_in_transaction_session_timeout = {};",
                    BUSY_TIMEOUT.as_millis(),
                    STATEMENT_TIMEOUT.as_millis(),
                    IDLE_IN_TRANSACTION.as_millis()
                ))
                .map_err(Error::from)?;
            self.client = Some(client);
        }
        self.client
            .as_mut()
            .ok_or_else(|| Error::Store("PostgreSQL connection lost".into()))
    }

    /// The connection (opened again if need be) and its statements, apart.
    fn parts(
        &mut self,
    ) -> Result<
        (
            &mut postgres::Client,
            &mut HashMap<String, postgres::Statement>,
        ),
        Error,
    > {
        self.client()?;
        let Pg {
            client, statements, ..
        } = self;
        let client = client
            .as_mut()
            .ok_or_else(|| Error::Store("PostgreSQL connection lost".into()))?;
        Ok((client, statements))
    }
}

/// The synchronous client closes its connection on a runtime of its own
/// when dropped, which cannot run inside another runtime's thread: a
/// store dropped there (the web app's connections, when its last request
/// ends) hands its connection to a thread of its own to close.
impl Drop for Pg {
    fn drop(&mut self) {
        let Some(client) = self.client.take() else {
            return;
        };
        if tokio::runtime::Handle::try_current().is_ok() {
            let closed = std::thread::Builder::new()
                .name("store-close".into())
                .spawn(move || drop(client));
            // No thread to be had: the connection is cut without its
            // goodbye (the database ends the session by itself).
            if let Err(e) = closed {
                eprintln!(
                    "{}",
                    serde_json::json!({"store": "close", "error": e.to_string()})
                );
            }
        }
    }
}

/// `url` without its query parameter `name`, and that parameter's value
/// (the client library does not know `sslrootcert`; libpq's name for it
/// is kept).
fn take_param(url: &str, name: &str) -> (String, Option<String>) {
    let Some((head, query)) = url.split_once('?') else {
        return (url.to_owned(), None);
    };
    let mut value = None;
    let kept: Vec<&str> = query
        .split('&')
        .filter(|kv| match kv.split_once('=') {
            Some((k, v)) if k == name => {
                value = Some(v.to_owned());
                false
            }
            _ => true,
        })
        .collect();
    if kept.is_empty() {
        (head.to_owned(), value)
    } else {
        (format!("{head}?{}", kept.join("&")), value)
    }
}

/// Whether every host `config` names is this machine (a loopback address,
/// `localhost`, or a Unix socket).
fn local_only(config: &postgres::Config) -> bool {
    use postgres::config::Host;
    !config.get_hosts().is_empty()
        && config.get_hosts().iter().all(|h| match h {
            Host::Tcp(name) => {
                name == "localhost"
                    || name
                        .trim_matches(['[', ']'])
                        .parse::<std::net::IpAddr>()
                        .is_ok_and(|ip| ip.is_loopback())
            }
            Host::Unix(_) => true,
        })
}

/// The TLS a store's connection uses. The store holds the tenants'
/// secrets, so a database on another host is reached over TLS only
/// (`sslmode=require`, the default there; `disable` and `prefer`, which may
/// fall back to clear text, are refused), its certificate checked against
/// `sslrootcert` (a PEM file) or else the public roots, for the host name
/// the URL gives. One on this host is reached in clear unless the URL asks
/// for `sslmode`.
fn tls_for(
    config: &mut postgres::Config,
    mode_given: bool,
    root_file: Option<&str>,
) -> Result<Option<tokio_postgres_rustls::MakeRustlsConnect>, String> {
    use postgres::config::SslMode;
    let local = local_only(config);
    if !mode_given {
        config.ssl_mode(if local {
            SslMode::Disable
        } else {
            SslMode::Require
        });
    }
    match config.get_ssl_mode() {
        SslMode::Disable if local => return Ok(None),
        SslMode::Disable | SslMode::Prefer if !local => {
            return Err(
                "a database on another host is reached over TLS only (sslmode=require): \
                 the store holds the tenants' secrets"
                    .into(),
            )
        }
        _ => {}
    }
    let mut roots = rustls::RootCertStore::empty();
    match root_file {
        Some(path) => {
            let pem = std::fs::read(path).map_err(|e| format!("sslrootcert {path}: {e}"))?;
            let mut found = 0;
            for cert in rustls_pemfile::certs(&mut pem.as_slice()) {
                let cert = cert.map_err(|e| format!("sslrootcert {path}: {e}"))?;
                roots
                    .add(cert)
                    .map_err(|e| format!("sslrootcert {path}: {e}"))?;
                found += 1;
            }
            if found == 0 {
                return Err(format!("sslrootcert {path}: no certificate in it"));
            }
        }
        None => roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned()),
    }
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let tls = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS: {e}"))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(Some(tokio_postgres_rustls::MakeRustlsConnect::new(tls)))
}

impl Store {
    /// Open the store at `db`: a SQLite file (created, mode 0600, with its
    /// schema on first use) or a PostgreSQL database (its schema created on
    /// first use, under a lock, so replicas starting at once make it once).
    pub fn open(db: impl Into<Db>) -> Result<Store, Error> {
        let db = db.into();
        let backend = match &db {
            Db::File(path) => Backend::Sqlite(open_sqlite(path)?),
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
                tx.execute("SELECT pg_advisory_xact_lock($1)", &[&WRITE_LOCK])?;
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
                let row = tx.query_one("SELECT pg_try_advisory_xact_lock($1)", &[&WRITE_LOCK])?;
                let taken: bool = row.try_get(0)?;
                if !taken {
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

fn open_sqlite(path: &Path) -> Result<Connection, Error> {
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

pub(super) struct PgTx<'a> {
    tx: postgres::Transaction<'a>,
    statements: &'a mut HashMap<String, postgres::Statement>,
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

/// A statement's value: what crosses between the store and either
/// database.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    Null,
    Int(i64),
    Text(String),
    Blob(Vec<u8>),
    /// An integer too large for the databases' 64-bit integers: refused
    /// when the statement runs.
    TooLarge(u64),
}

impl Value {
    fn kind(&self) -> &'static str {
        match self {
            Value::Null => "NULL",
            Value::Int(_) => "an integer",
            Value::Text(_) => "text",
            Value::Blob(_) => "bytes",
            Value::TooLarge(_) => "an integer over 2^63",
        }
    }
}

/// What a statement's parameter can be made from.
pub trait Param {
    fn value(&self) -> Value;
}

impl<T: Param + ?Sized> Param for &T {
    fn value(&self) -> Value {
        (**self).value()
    }
}
impl Param for str {
    fn value(&self) -> Value {
        Value::Text(self.to_owned())
    }
}
impl Param for String {
    fn value(&self) -> Value {
        Value::Text(self.clone())
    }
}
impl Param for [u8] {
    fn value(&self) -> Value {
        Value::Blob(self.to_vec())
    }
}
impl Param for Vec<u8> {
    fn value(&self) -> Value {
        Value::Blob(self.clone())
    }
}
impl Param for bool {
    fn value(&self) -> Value {
        Value::Int(i64::from(*self))
    }
}
impl Param for Value {
    fn value(&self) -> Value {
        self.clone()
    }
}
impl<T: Param> Param for Option<T> {
    fn value(&self) -> Value {
        self.as_ref().map_or(Value::Null, Param::value)
    }
}
macro_rules! int_param {
    ($($t:ty),*) => {$(
        impl Param for $t {
            fn value(&self) -> Value {
                Value::Int(i64::from(*self))
            }
        }
    )*};
}
int_param!(i64, i32, u32, u16, u8);
impl Param for u64 {
    fn value(&self) -> Value {
        i64::try_from(*self).map_or(Value::TooLarge(*self), Value::Int)
    }
}
impl Param for usize {
    fn value(&self) -> Value {
        (*self as u64).value()
    }
}

/// A statement's parameters, in order (`?1` first).
macro_rules! params {
    () => { [] as [$crate::store::db::Value; 0] };
    ($($x:expr),+ $(,)?) => {
        [$($crate::store::db::Param::value(&$x)),+]
    };
}
pub(crate) use params;

/// A value read from a column.
pub trait FromCol: Sized {
    fn from_col(v: Value) -> Result<Self, String>;
}

impl FromCol for Value {
    fn from_col(v: Value) -> Result<Self, String> {
        Ok(v)
    }
}
impl FromCol for String {
    fn from_col(v: Value) -> Result<Self, String> {
        match v {
            Value::Text(t) => Ok(t),
            other => Err(format!("text expected, {} found", other.kind())),
        }
    }
}
impl FromCol for Vec<u8> {
    fn from_col(v: Value) -> Result<Self, String> {
        match v {
            Value::Blob(b) => Ok(b),
            Value::Text(t) => Ok(t.into_bytes()),
            other => Err(format!("bytes expected, {} found", other.kind())),
        }
    }
}
impl FromCol for bool {
    fn from_col(v: Value) -> Result<Self, String> {
        i64::from_col(v).map(|i| i != 0)
    }
}
impl FromCol for i64 {
    fn from_col(v: Value) -> Result<Self, String> {
        match v {
            Value::Int(i) => Ok(i),
            other => Err(format!("an integer expected, {} found", other.kind())),
        }
    }
}
macro_rules! int_col {
    ($($t:ty),*) => {$(
        impl FromCol for $t {
            fn from_col(v: Value) -> Result<Self, String> {
                let i = i64::from_col(v)?;
                <$t>::try_from(i).map_err(|_| {
                    format!("{i} is out of range for {}", stringify!($t))
                })
            }
        }
    )*};
}
int_col!(u64, u32, i32, u16, u8, usize);
impl<T: FromCol> FromCol for Option<T> {
    fn from_col(v: Value) -> Result<Self, String> {
        match v {
            Value::Null => Ok(None),
            v => T::from_col(v).map(Some),
        }
    }
}

/// Something that names a column of a row: its position.
pub trait ColIndex {
    fn index(&self) -> usize;
}
impl ColIndex for usize {
    fn index(&self) -> usize {
        *self
    }
}

/// One row a query returned, its values taken out of the database's own
/// types.
#[derive(Debug)]
pub struct Row {
    values: Vec<Value>,
}

impl Row {
    /// Column `idx`, as `T`.
    pub fn get<I: ColIndex, T: FromCol>(&self, idx: I) -> Result<T, Error> {
        let idx = idx.index();
        let v = self
            .values
            .get(idx)
            .cloned()
            .ok_or_else(|| Error::Store(format!("column {idx} is not in the row")))?;
        T::from_col(v).map_err(|e| Error::Store(format!("column {idx}: {e}")))
    }
}

/// A query's outcome when it must return one row: none is its own case.
#[derive(Debug)]
pub enum RowError {
    NoRows,
    Failed(Error),
}

impl From<Error> for RowError {
    fn from(e: Error) -> RowError {
        RowError::Failed(e)
    }
}

impl From<RowError> for Error {
    fn from(e: RowError) -> Error {
        match e {
            RowError::NoRows => Error::Store("the query returned no row".into()),
            RowError::Failed(e) => e,
        }
    }
}

/// A one-row query's outcome read as "none, or this one".
pub trait OptionalExtension<T> {
    fn optional(self) -> Result<Option<T>, Error>;
}

impl<T> OptionalExtension<T> for Result<T, RowError> {
    fn optional(self) -> Result<Option<T>, Error> {
        match self {
            Ok(t) => Ok(Some(t)),
            Err(RowError::NoRows) => Ok(None),
            Err(RowError::Failed(e)) => Err(e),
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

impl PgTx<'_> {
    fn prepare(&mut self, sql: &str) -> Result<postgres::Statement, Error> {
        if let Some(s) = self.statements.get(sql) {
            return Ok(s.clone());
        }
        let stmt = self.tx.prepare(&pg_sql(sql))?;
        if self.statements.len() >= STATEMENT_CACHE {
            self.statements.clear();
        }
        self.statements.insert(sql.to_owned(), stmt.clone());
        Ok(stmt)
    }
}

fn check_params(params: &[Value]) -> Result<(), Error> {
    for (i, p) in params.iter().enumerate() {
        if let Value::TooLarge(v) = p {
            return Err(Error::Store(format!(
                "parameter {}: {v} is too large for the store's integers",
                i + 1
            )));
        }
    }
    Ok(())
}

/// `sql` with `?N` written `$N`, as PostgreSQL numbers its parameters
/// (outside quoted text).
pub(super) fn pg_sql(sql: &str) -> String {
    let mut out = String::with_capacity(sql.len());
    let mut quoted = false;
    let mut chars = sql.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\'' => {
                quoted = !quoted;
                out.push(c);
            }
            '?' if !quoted && chars.peek().is_some_and(|n| n.is_ascii_digit()) => out.push('$'),
            _ => out.push(c),
        }
    }
    out
}

fn sqlite_value(v: &Value) -> rusqlite::types::Value {
    use rusqlite::types::Value as V;
    match v {
        Value::Null | Value::TooLarge(_) => V::Null,
        Value::Int(i) => V::Integer(*i),
        Value::Text(t) => V::Text(t.clone()),
        Value::Blob(b) => V::Blob(b.clone()),
    }
}

fn from_sqlite(v: rusqlite::types::ValueRef<'_>) -> Value {
    use rusqlite::types::ValueRef as V;
    match v {
        V::Null => Value::Null,
        V::Integer(i) => Value::Int(i),
        // No column holds a real; one read as text keeps its value.
        V::Real(r) => Value::Text(r.to_string()),
        V::Text(t) => Value::Text(String::from_utf8_lossy(t).into_owned()),
        V::Blob(b) => Value::Blob(b.to_vec()),
    }
}

/// A [`Value`] as PostgreSQL's parameter of whatever type it inferred.
#[derive(Debug)]
struct PgParam<'v>(&'v Value);

impl postgres::types::ToSql for PgParam<'_> {
    fn to_sql(
        &self,
        ty: &postgres::types::Type,
        out: &mut bytes::BytesMut,
    ) -> Result<postgres::types::IsNull, Box<dyn std::error::Error + Sync + Send>> {
        use postgres::types::{IsNull, Type};
        let mismatch = || -> Box<dyn std::error::Error + Sync + Send> {
            format!("{} given for a parameter of type {ty}", self.0.kind()).into()
        };
        match self.0 {
            Value::Null => Ok(IsNull::Yes),
            Value::TooLarge(_) => Err(mismatch()),
            Value::Int(i) => match *ty {
                Type::INT8 => i.to_sql(ty, out),
                Type::INT4 => i32::try_from(*i).map_err(|_| mismatch())?.to_sql(ty, out),
                Type::INT2 => i16::try_from(*i).map_err(|_| mismatch())?.to_sql(ty, out),
                Type::BOOL => (*i != 0).to_sql(ty, out),
                Type::TEXT | Type::VARCHAR | Type::UNKNOWN => i.to_string().to_sql(ty, out),
                _ => Err(mismatch()),
            },
            Value::Text(t) => match *ty {
                Type::TEXT | Type::VARCHAR | Type::BPCHAR | Type::NAME | Type::UNKNOWN => {
                    t.as_str().to_sql(ty, out)
                }
                Type::BYTEA => t.as_bytes().to_sql(ty, out),
                _ => Err(mismatch()),
            },
            Value::Blob(b) => match *ty {
                Type::BYTEA => b.as_slice().to_sql(ty, out),
                _ => Err(mismatch()),
            },
        }
    }

    fn accepts(_: &postgres::types::Type) -> bool {
        true
    }

    postgres::types::to_sql_checked!();
}

fn pg_params(params: &[Value]) -> Vec<PgParam<'_>> {
    params.iter().map(PgParam).collect()
}

fn pg_refs<'p>(params: &'p [PgParam<'_>]) -> Vec<&'p (dyn postgres::types::ToSql + Sync)> {
    params
        .iter()
        .map(|p| p as &(dyn postgres::types::ToSql + Sync))
        .collect()
}

fn from_pg_row(row: &postgres::Row) -> Result<Row, Error> {
    use postgres::types::Type;
    let mut values = Vec::with_capacity(row.len());
    for (i, col) in row.columns().iter().enumerate() {
        let ty = col.type_();
        let v = match *ty {
            Type::INT8 => row.try_get::<_, Option<i64>>(i)?.map(Value::Int),
            Type::INT4 => row
                .try_get::<_, Option<i32>>(i)?
                .map(|v| Value::Int(v.into())),
            Type::INT2 => row
                .try_get::<_, Option<i16>>(i)?
                .map(|v| Value::Int(v.into())),
            Type::BOOL => row
                .try_get::<_, Option<bool>>(i)?
                .map(|v| Value::Int(v.into())),
            Type::TEXT | Type::VARCHAR | Type::BPCHAR | Type::NAME | Type::UNKNOWN => {
                row.try_get::<_, Option<String>>(i)?.map(Value::Text)
            }
            Type::BYTEA => row.try_get::<_, Option<Vec<u8>>>(i)?.map(Value::Blob),
            _ => {
                return Err(Error::Store(format!(
                    "column {} is of type {ty}, which the store does not read",
                    col.name()
                )))
            }
        };
        values.push(v.unwrap_or(Value::Null));
    }
    Ok(Row { values })
}

/// PostgreSQL's word on an error: its code and message, never its detail
/// (a failing row's values may be in it).
pub(crate) fn pg_message(e: &postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => format!("{} ({})", db.message(), db.code().code()),
        None => {
            // The client's own errors (closed, timed out, I/O) carry no row.
            let text = e.to_string();
            text.chars().take(300).collect()
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
) -> Result<T, Error> {
    parse(&text).ok_or_else(|| Error::Store(format!("column {idx}: unknown word {text:?}")))
}

pub(super) fn json_col<T: serde::de::DeserializeOwned>(
    idx: usize,
    text: String,
) -> Result<T, Error> {
    serde_json::from_str(&text).map_err(|e| {
        Error::Store(format!(
            "column {idx}: a stored JSON column does not parse: {e}"
        ))
    })
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
