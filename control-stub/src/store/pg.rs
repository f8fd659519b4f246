//! The PostgreSQL side of the store: one connection, made again when the
//! database drops it, reached over TLS when the database is on another
//! host; the session settings every connection gets (how long a statement
//! and an idle transaction may last); the statements prepared once per
//! connection, written with PostgreSQL's `$N` parameters; and what its
//! errors may say.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use super::write_lock::BUSY_TIMEOUT;
use crate::error::Error;

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

/// Prepared statements kept per PostgreSQL connection: the store has fewer
/// than this many distinct statements, so each is prepared once.
const STATEMENT_CACHE: usize = 512;

/// One connection to PostgreSQL, made again when the database dropped it
/// (a restart, a failover), and its prepared statements.
pub(super) struct Pg {
    config: postgres::Config,
    /// TLS to the database; none only for one on this host.
    tls: Option<tokio_postgres_rustls::MakeRustlsConnect>,
    client: Option<postgres::Client>,
    statements: HashMap<String, postgres::Statement>,
}

impl Pg {
    pub(super) fn connect(url: &str) -> Result<Pg, Error> {
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
    pub(super) fn client(&mut self) -> Result<&mut postgres::Client, Error> {
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
    pub(super) fn parts(
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

/// `url` with the password between `:` and `@` of its authority replaced.
pub(super) fn redact_url(url: &str) -> String {
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

pub(super) struct PgTx<'a> {
    pub(super) tx: postgres::Transaction<'a>,
    pub(super) statements: &'a mut HashMap<String, postgres::Statement>,
}

impl PgTx<'_> {
    pub(super) fn prepare(&mut self, sql: &str) -> Result<postgres::Statement, Error> {
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
