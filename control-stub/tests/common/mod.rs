//! Shared test helpers: a store in a temporary directory, a fake gateway
//! pair, a dump of every row, the built `control-stub` binary, the tests'
//! own Web Push endpoint (`push_endpoint`), and people with passkeys and
//! the web app in process (`people`).

#![allow(dead_code)]

pub mod people;
pub mod push_endpoint;

use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};

use talos_control_stub::fake::{FakeLink, FakeVerifier};
use talos_control_stub::link::ReportVerifier;
use talos_control_stub::store::Db;
use talos_control_stub::{Lifecycle, Mode, StartRequest, Store, Transition};

pub const ACCEPT: FakeVerifier = FakeVerifier::accepting();

/// Whether the tests' stores are PostgreSQL databases: with
/// `TALOS_TEST_STORE=postgres`, each store is a fresh database on the
/// server `TALOS_TEST_POSTGRES` names (`scripts/test.sh` starts one with
/// `scripts/postgres.sh` and runs this crate's tests again on it);
/// otherwise each is a SQLite file in a temporary directory.
pub fn on_postgres() -> bool {
    std::env::var("TALOS_TEST_STORE").is_ok_and(|v| v == "postgres")
}

/// A store's place for one test: a fresh PostgreSQL database (see
/// [`on_postgres`]) or `stub.db` in `dir`.
pub fn test_db(dir: &Path) -> Db {
    if on_postgres() {
        fresh_postgres_db()
    } else {
        Db::File(dir.join("stub.db"))
    }
}

/// A new, empty database on the test server: its URL.
pub fn fresh_postgres_db() -> Db {
    let server = std::env::var("TALOS_TEST_POSTGRES").expect(
        "TALOS_TEST_STORE=postgres needs TALOS_TEST_POSTGRES, a server's URL \
         (scripts/postgres.sh start DIR prints one)",
    );
    let mut client = postgres::Client::connect(&server, postgres::NoTls).unwrap();
    let mut id = [0u8; 8];
    aws_lc_rs::rand::fill(&mut id).unwrap();
    let name = format!("t_{}", hex::encode(id));
    client
        .batch_execute(&format!("CREATE DATABASE {name}"))
        .unwrap();
    let base = server.rsplit_once('/').unwrap().0;
    Db::Postgres(format!("{base}/{name}"))
}

/// A store in its own temporary directory (or database) and a fake
/// gateway pair.
pub struct Env {
    pub dir: tempfile::TempDir,
    pub db: Db,
    pub store: Store,
    pub link: FakeLink,
}

impl Env {
    pub fn new() -> Env {
        let dir = tempfile::tempdir().unwrap();
        let db = test_db(dir.path());
        let store = Store::open(&db).unwrap();
        Env {
            dir,
            db,
            store,
            link: FakeLink::default(),
        }
    }

    pub fn db(&self) -> Db {
        self.db.clone()
    }

    /// The state machine with a verifier that accepts every report.
    pub fn life(&mut self) -> Lifecycle<'_> {
        Lifecycle::new(&mut self.store, &self.link, &ACCEPT)
    }

    /// The state machine with another verifier.
    pub fn life_with<'a>(&'a mut self, verifier: &'a dyn ReportVerifier) -> Lifecycle<'a> {
        Lifecycle::new(&mut self.store, &self.link, verifier)
    }

    /// The egress list and the tenant `acme`'s secrets most tests use.
    pub fn with_policy(mut self) -> Env {
        for name in ["api.github.com", "api.example.com", "pypi.org"] {
            self.store.egress_add(name).unwrap();
        }
        self.store
            .secret_set("acme", "GH", b"gh-value-1-QZX")
            .unwrap();
        self.store
            .secret_set("acme", "EX", b"ex-value-1-QZX")
            .unwrap();
        self
    }

    /// Start a session of tenant `acme` with the usual names and
    /// attachments.
    pub fn start(&mut self, mode: Mode) -> Transition {
        self.life().start(&request(mode)).unwrap()
    }

    pub fn dump(&self) -> String {
        dump(self.db())
    }

    /// Deliver the fake pair's chain reports and issue the certificate
    /// with a test key; returns it as printed.
    pub fn issue(&mut self, id: &str) -> serde_json::Value {
        self.deliver_chain();
        let key = talos_certs::GatewayKey::generate().unwrap();
        talos_control_stub::certificate::issue(&mut self.store, id, &key).unwrap();
        talos_control_stub::certificate(&self.store, id).unwrap()
    }

    /// Deliver, as the batch consumer would from each member's batch
    /// chain, every drop report the fake members have made so far (batch
    /// numbers from 1): what lets a certificate be complete.
    pub fn deliver_chain(&mut self) {
        let reports = self.link.chain_reports();
        self.store
            .write(|tx| {
                for (i, view) in reports.iter().enumerate() {
                    talos_control_stub::confirm::chain_drop_report(
                        tx,
                        &ACCEPT,
                        view,
                        i as u64 + 1,
                    )?;
                }
                Ok(())
            })
            .unwrap();
    }
}

/// A start request: two destinations, one attachment on each.
pub fn request(mode: Mode) -> StartRequest {
    StartRequest::new(
        "acme",
        vec!["10.1.0.2".into()],
        vec!["api.github.com".into(), "api.example.com".into()],
        vec![
            "GH=api.github.com:authorization:Bearer".into(),
            "EX=api.example.com:x-api-key".into(),
        ],
        mode,
    )
}

/// Every row of every table, and the schema version, as text: two dumps
/// are equal exactly when nothing changed.
pub fn dump(db: impl Into<Db>) -> String {
    Store::open(db).unwrap().test_dump().unwrap()
}

/// What a run of the binary gave.
#[derive(Debug)]
pub struct Output {
    pub status: i32,
    pub stdout: String,
    pub stderr: String,
}

impl Output {
    /// The error code the binary printed (`error: <code>: …`).
    pub fn code(&self) -> Option<&str> {
        let rest = self.stderr.strip_prefix("error: ")?;
        rest.split(':').next()
    }
}

/// Run the built `control-stub` against `db`, with `stdin` on its input.
pub fn bin(db: impl Into<Db>, args: &[&str], stdin: &[u8]) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_control-stub"))
        .arg("--db")
        .arg(db.into().as_arg())
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // A command that does not read its input (most of them) may exit before
    // the write: a broken pipe then is no failure of the test.
    match child.stdin.take().unwrap().write_all(stdin) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {}
        other => other.unwrap(),
    }
    let out = child.wait_with_output().unwrap();
    Output {
        status: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8(out.stdout).unwrap(),
        stderr: String::from_utf8(out.stderr).unwrap(),
    }
}

/// Serve `gateway` (a stand-in `Gateway` service) on 127.0.0.1:0 with the
/// control identity `id` from `dir`, on a thread of its own (the link under
/// test blocks on its own runtime); returns the address.
pub fn serve_stand_in<G>(dir: &Path, id: &str, gateway: G) -> std::net::SocketAddr
where
    G: talos_control_stub::pb::gateway_server::Gateway,
{
    use std::sync::Arc;

    use hyper_util::rt::{TokioExecutor, TokioIo};
    use talos_control_stub::pb::gateway_server::GatewayServer;

    let tls = talos_control_stub::identity::Identity::load(dir, id)
        .unwrap()
        .server_config()
        .unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            tx.send(listener.local_addr().unwrap()).unwrap();
            let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(tls));
            let routes = tonic::service::Routes::new(GatewayServer::new(gateway));
            loop {
                let Ok((tcp, _)) = listener.accept().await else {
                    return;
                };
                let acceptor = acceptor.clone();
                let routes = routes.clone();
                tokio::spawn(async move {
                    let Ok(tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    let service = hyper::service::service_fn(
                        move |req: hyper::Request<hyper::body::Incoming>| {
                            tower::ServiceExt::oneshot(routes.clone(), req)
                        },
                    );
                    let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(tls), service)
                        .await;
                });
            }
        });
    });
    rx.recv().unwrap()
}

/// A PostgreSQL server of a test's own (`scripts/postgres.sh` in a
/// temporary folder), for the tests that stop and start it; stopped by its
/// postmaster's PID when dropped.
pub struct OwnPostgres {
    pub dir: tempfile::TempDir,
    pub url: String,
}

impl OwnPostgres {
    pub fn start() -> OwnPostgres {
        let dir = tempfile::tempdir().unwrap();
        let url = postgres_script("start", dir.path(), false);
        OwnPostgres { dir, url }
    }

    /// One that also speaks TLS, its certificate from a CA of its own
    /// ([`OwnPostgres::ca_file`]).
    pub fn start_tls() -> OwnPostgres {
        let dir = tempfile::tempdir().unwrap();
        let url = postgres_script("start", dir.path(), true);
        OwnPostgres { dir, url }
    }

    /// The CA of a server started with [`OwnPostgres::start_tls`].
    pub fn ca_file(&self) -> std::path::PathBuf {
        self.dir.path().join("pg").join("ca.pem")
    }

    /// Stop it (a fast shutdown: sessions are cut).
    pub fn stop(&self) {
        postgres_script("stop", self.dir.path(), false);
    }

    /// Start it again, on the same port, with the same data.
    pub fn restart(&self) {
        postgres_script("start", self.dir.path(), false);
    }

    pub fn db(&self) -> Db {
        Db::Postgres(self.url.clone())
    }
}

impl Drop for OwnPostgres {
    fn drop(&mut self) {
        postgres_script("stop", self.dir.path(), false);
    }
}

fn postgres_script(cmd: &str, dir: &Path, tls: bool) -> String {
    let out = Command::new(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../scripts/postgres.sh"
    ))
    .env("PG_TLS", if tls { "1" } else { "0" })
    .arg(cmd)
    .arg(dir.join("pg"))
    .output()
    .unwrap();
    assert!(
        out.status.success(),
        "scripts/postgres.sh {cmd}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap().trim().to_owned()
}
