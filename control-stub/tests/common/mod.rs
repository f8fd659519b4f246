//! Shared test helpers: a store in a temporary directory, a fake gateway
//! pair, a dump of every row, and the built `control-stub` binary.

#![allow(dead_code)]

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use talos_control_stub::fake::{FakeLink, FakeVerifier};
use talos_control_stub::link::ReportVerifier;
use talos_control_stub::{Lifecycle, Mode, StartRequest, Store, Transition};

pub const ACCEPT: FakeVerifier = FakeVerifier::accepting();

/// A store in its own temporary directory and a fake gateway pair.
pub struct Env {
    pub dir: tempfile::TempDir,
    pub store: Store,
    pub link: FakeLink,
}

impl Env {
    pub fn new() -> Env {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("stub.db")).unwrap();
        Env {
            dir,
            store,
            link: FakeLink::default(),
        }
    }

    pub fn db(&self) -> PathBuf {
        self.dir.path().join("stub.db")
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
        dump(&self.db())
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
pub fn dump(db: &Path) -> String {
    let conn =
        rusqlite::Connection::open_with_flags(db, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
            .unwrap();
    let mut out = String::new();
    let version: i64 = conn
        .pragma_query_value(None, "user_version", |r| r.get(0))
        .unwrap();
    out.push_str(&format!("user_version {version}\n"));
    let mut tables = conn
        .prepare("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")
        .unwrap();
    let names: Vec<String> = tables
        .query_map([], |r| r.get(0))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    for table in names {
        out.push_str(&format!("table {table}\n"));
        let mut stmt = conn
            .prepare(&format!("SELECT * FROM \"{table}\" ORDER BY rowid"))
            .unwrap();
        let columns = stmt.column_count();
        let mut rows = stmt.query([]).unwrap();
        while let Some(row) = rows.next().unwrap() {
            let values: Vec<String> = (0..columns)
                .map(|i| format!("{:?}", row.get::<_, rusqlite::types::Value>(i).unwrap()))
                .collect();
            out.push_str(&values.join(" | "));
            out.push('\n');
        }
    }
    out
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
pub fn bin(db: &Path, args: &[&str], stdin: &[u8]) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_control-stub"))
        .arg("--db")
        .arg(db)
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
