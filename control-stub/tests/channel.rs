//! The control channel, control stub side: `init`'s identities, and the
//! `ControlPlane` batch consumer served over mutual TLS on loopback, with
//! real tonic clients presenting (or not) certificates.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use hyper_util::rt::TokioIo;
use rustls::pki_types::ServerName;
use talos_certs::{BatchWriter, GatewayKey};
use talos_control_stub::identity::{self, Identity};
use talos_control_stub::pb;
use talos_control_stub::pb::control_plane_client::ControlPlaneClient;
use talos_control_stub::server::control::ControlListener;
use talos_control_stub::server::intake::Intake;
use talos_control_stub::Store;
use tokio_rustls::TlsConnector;
use tonic::transport::{Channel, Endpoint};

fn mode(path: &Path) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).unwrap().permissions().mode() & 0o777
}

#[test]
fn init_writes_private_keys_and_refuses_to_overwrite() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("control");
    let written = identity::init(&dir, &["gw-a".into(), "gw-b".into()]).unwrap();
    // CA, stub and two gateways (a certificate and key each), the relay's
    // signing key, the control plane's (certificates), the VAPID key (Web
    // Push) and the operator CA (a certificate and key).
    assert_eq!(written.files.len(), 13);
    assert_eq!(mode(&dir.join("relay.key")), 0o600);
    assert_eq!(mode(&dir.join("plane.key")), 0o600);
    assert_eq!(mode(&dir.join("vapid.key")), 0o600);
    identity::vapid_key(&dir).unwrap();
    for f in [
        "ca.key",
        "stub.key",
        "gw-a.key",
        "gw-b.key",
        "operator-ca.key",
    ] {
        assert_eq!(mode(&dir.join(f)), 0o600, "{f}");
        let text = std::fs::read_to_string(dir.join(f)).unwrap();
        assert!(text.contains("PRIVATE KEY"), "{f}");
    }
    for f in ["ca.pem", "stub.pem", "gw-a.pem", "gw-b.pem"] {
        assert!(std::fs::read_to_string(dir.join(f))
            .unwrap()
            .contains("BEGIN CERTIFICATE"));
    }
    // Each identity loads and makes both TLS configs, and carries its
    // role beside its name.
    for (who, name, role) in [
        ("stub", "control-stub", talos_contract::role::CONTROL_PLANE),
        ("gw-a", "gw-a", talos_contract::role::GATEWAY),
        ("gw-b", "gw-b", talos_contract::role::GATEWAY),
    ] {
        let id = Identity::load(&dir, who).unwrap();
        id.client_config().unwrap();
        id.server_config().unwrap();
        let pem = std::fs::read(dir.join(format!("{who}.pem"))).unwrap();
        let der = rustls_pemfile::certs(&mut &pem[..])
            .next()
            .unwrap()
            .unwrap();
        let cert = webpki::EndEntityCert::try_from(&der).unwrap();
        for n in [name, role] {
            let n = rustls::pki_types::ServerName::try_from(n).unwrap();
            cert.verify_is_valid_for_subject_name(&n).unwrap();
        }
        let other = if role == talos_contract::role::GATEWAY {
            talos_contract::role::CONTROL_PLANE
        } else {
            talos_contract::role::GATEWAY
        };
        let other = rustls::pki_types::ServerName::try_from(other).unwrap();
        assert!(
            cert.verify_is_valid_for_subject_name(&other).is_err(),
            "{who}"
        );
    }

    let before: Vec<Vec<u8>> = written
        .files
        .iter()
        .map(|f| std::fs::read(f).unwrap())
        .collect();
    let err = identity::init(&dir, &["gw-a".into()]).unwrap_err();
    assert_eq!(err.code(), "io_failed");
    assert!(err.to_string().contains("already exists"), "{err}");
    // A new id in a used directory is refused too, before anything is written.
    let err = identity::init(&dir, &["gw-c".into()]).unwrap_err();
    assert_eq!(err.code(), "io_failed");
    assert!(!dir.join("gw-c.pem").exists());
    assert!(!dir.join("gw-c.key").exists());
    let after: Vec<Vec<u8>> = written
        .files
        .iter()
        .map(|f| std::fs::read(f).unwrap())
        .collect();
    assert_eq!(before, after);
}

#[test]
fn the_command_line_is_well_formed() {
    use clap::CommandFactory;
    talos_control_stub::cli::Cli::command().debug_assert();
}

#[test]
fn init_through_the_command_line_prints_what_it_wrote() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("c");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_control-stub"))
        .args(["init", "--dir"])
        .arg(&dir)
        .args(["--gateway", "gw-a"])
        .current_dir(tmp.path())
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let printed: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(printed["files"].as_array().unwrap().len(), 11);
    assert!(printed["note"].as_str().unwrap().contains("offline"));
    // init needs no store.
    assert!(!tmp.path().join("control-stub.db").exists());
    let again = std::process::Command::new(env!("CARGO_BIN_EXE_control-stub"))
        .args(["init", "--dir"])
        .arg(&dir)
        .args(["--gateway", "gw-a"])
        .output()
        .unwrap();
    assert_eq!(again.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&again.stderr).contains("io_failed"));
}

/// `init --operator NAME` (repeatable) issues operators' certificates;
/// on a directory init wrote, `--operator` alone adds operators and
/// writes only their files; nothing is ever overwritten.
#[test]
fn init_issues_operators_and_adds_them_to_an_existing_directory() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("c");
    let run = |args: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_control-stub"))
            .arg("init")
            .arg("--dir")
            .arg(&dir)
            .args(args)
            .current_dir(tmp.path())
            .output()
            .unwrap()
    };
    let out = run(&[
        "--gateway",
        "gw-a",
        "--operator",
        "opal",
        "--operator",
        "olga",
    ]);
    assert!(out.status.success(), "{out:?}");
    let printed: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    // 11 as before, and each operator's certificate and key.
    assert_eq!(printed["files"].as_array().unwrap().len(), 15);
    for f in ["operator-opal.key", "operator-olga.key"] {
        assert_eq!(mode(&dir.join(f)), 0o600, "{f}");
    }
    let opal = std::fs::read(dir.join("operator-opal.pem")).unwrap();

    let added = run(&["--operator", "omar"]);
    assert!(added.status.success(), "{added:?}");
    let printed: serde_json::Value = serde_json::from_slice(&added.stdout).unwrap();
    let files: Vec<&str> = printed["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f.as_str().unwrap())
        .collect();
    assert_eq!(files.len(), 2, "{files:?}");
    assert!(files[0].ends_with("operator-omar.pem") && files[1].ends_with("operator-omar.key"));

    // The same operator again, or a gateway with it: refused, nothing
    // written or changed.
    for args in [
        &["--operator", "omar"][..],
        &["--gateway", "gw-z", "--operator", "oz"],
    ] {
        let again = run(args);
        assert_eq!(again.status.code(), Some(2), "{args:?}");
        assert!(String::from_utf8_lossy(&again.stderr).contains("io_failed"));
    }
    assert!(!dir.join("operator-oz.pem").exists() && !dir.join("gw-z.pem").exists());
    assert_eq!(std::fs::read(dir.join("operator-opal.pem")).unwrap(), opal);

    // Anywhere else, --operator names who asks, once.
    let twice = std::process::Command::new(env!("CARGO_BIN_EXE_control-stub"))
        .args(["--db"])
        .arg(tmp.path().join("s.db"))
        .args([
            "--operator",
            "a",
            "--operator",
            "b",
            "policy",
            "lab-approvals",
            "show",
        ])
        .output()
        .unwrap();
    assert_eq!(twice.status.code(), Some(2), "{twice:?}");
    assert!(String::from_utf8_lossy(&twice.stderr).contains("name_invalid"));
}

/// A served consumer on loopback with its identities and store.
struct Served {
    tmp: tempfile::TempDir,
    addr: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

impl Served {
    fn dir(&self) -> std::path::PathBuf {
        self.tmp.path().join("control")
    }

    fn db(&self) -> std::path::PathBuf {
        self.tmp.path().join("stub.db")
    }

    fn count(&self, sql: &str) -> i64 {
        let conn = rusqlite::Connection::open(self.db()).unwrap();
        conn.query_row(sql, [], |r| r.get(0)).unwrap()
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

/// The control listener over `listener` with `tls`, serving a batch
/// intake on `store`, until `stopped` fires: then it drains as `serve`'s
/// does (closed, its connections cut, the intake's work waited for).
fn serve(
    listener: tokio::net::TcpListener,
    tls: rustls::ServerConfig,
    store: Store,
    stopped: tokio::sync::oneshot::Receiver<()>,
) {
    let control = ControlListener::new(listener, tls, Intake::new(store)).unwrap();
    tokio::spawn(async move {
        control.start();
        let _ = stopped.await;
        control.close().await;
        control.finish(tokio::time::Instant::now()).await;
        control.intake().stop().await;
    });
}

/// Identities for gw-a and gw-b, gw-a registered with `key`, and the
/// batch intake served on 127.0.0.1:0.
async fn served(key: &GatewayKey) -> Served {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("control");
    identity::init(&dir, &["gw-a".into(), "gw-b".into()]).unwrap();
    let db = tmp.path().join("stub.db");
    let mut store = Store::open(&db).unwrap();
    store
        .register_gateway("gw-a", &hex::encode(key.public_key()))
        .unwrap();
    let tls = Identity::load(&dir, "stub")
        .unwrap()
        .server_config()
        .unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    serve(listener, tls, store, stopped);
    Served {
        tmp,
        addr,
        stop: Some(stop),
    }
}

/// A ControlPlane client with `tls`, connecting to `addr` and checking the
/// name `control-stub`.
async fn client(
    addr: SocketAddr,
    tls: rustls::ClientConfig,
) -> Result<ControlPlaneClient<Channel>, tonic::transport::Error> {
    let connector = TlsConnector::from(Arc::new(tls));
    let name = ServerName::try_from(identity::STUB_NAME).unwrap();
    let service = tower::service_fn(move |_uri: hyper::Uri| {
        let connector = connector.clone();
        let name = name.clone();
        async move {
            let tcp = tokio::net::TcpStream::connect(addr).await?;
            let tls = connector.connect(name, tcp).await?;
            Ok::<_, std::io::Error>(TokioIo::new(tls))
        }
    });
    let channel = Endpoint::from_static("https://control-stub")
        .connect_timeout(Duration::from_secs(5))
        .timeout(Duration::from_secs(10))
        .connect_with_connector(service)
        .await?;
    Ok(ControlPlaneClient::new(channel))
}

fn envelope(s: &talos_certs::Signed) -> pb::Signed {
    pb::Signed {
        kind: s.kind.as_str().into(),
        key_id: s.key_id.clone(),
        payload: s.payload.clone(),
        signature: s.signature.clone(),
    }
}

fn record(session: &str, n: u32) -> String {
    format!(r#"{{"session_id":"{session}","sni":"api.example.com","n":{n}}}"#)
}

async fn submit(c: &mut ControlPlaneClient<Channel>, s: &talos_certs::Signed) -> pb::BatchAck {
    c.submit_batch(envelope(s)).await.unwrap().into_inner()
}

use pb::batch_ack::Status as AckStatus;

#[tokio::test]
async fn batches_are_accepted_once_and_tampering_is_rejected_and_recorded() {
    let key = Arc::new(GatewayKey::generate().unwrap());
    let s = served(&key).await;
    let tls = Identity::load(&s.dir(), "gw-a")
        .unwrap()
        .client_config()
        .unwrap();
    let mut c = client(s.addr, tls).await.unwrap();
    let mut writer = BatchWriter::new(key.clone(), "gw-a");

    let b1 = writer
        .seal(
            "2026-11-29T12:00:00Z",
            &[record("sbx-1", 1), record("sbx-1", 2)],
        )
        .unwrap();
    let ack = submit(&mut c, &b1).await;
    assert_eq!(ack.status(), AckStatus::Accepted);
    assert_eq!(ack.seq, 1);
    assert_eq!(s.count("SELECT count(*) FROM batches"), 1);
    assert_eq!(
        s.count("SELECT count(*) FROM connection_records WHERE session_id = 'sbx-1'"),
        2
    );

    // The same batch again: a re-delivery, nothing new stored.
    let ack = submit(&mut c, &b1).await;
    assert_eq!(ack.status(), AckStatus::Duplicate);
    assert_eq!(ack.seq, 1);
    assert_eq!(s.count("SELECT count(*) FROM connection_records"), 2);

    // The next batch, with one byte of its payload flipped.
    let b2 = writer
        .seal("2026-11-29T12:00:05Z", &[record("sbx-1", 3)])
        .unwrap();
    let mut tampered = b2.clone();
    let at = tampered
        .payload
        .windows(3)
        .position(|w| w == b"sbx")
        .unwrap();
    tampered.payload[at] = b'x';
    let ack = submit(&mut c, &tampered).await;
    assert_eq!(ack.status(), AckStatus::Rejected);
    assert_eq!(ack.reason, "bad_signature");
    assert_eq!(
        s.count(
            "SELECT count(*) FROM batch_rejections WHERE gateway_id = 'gw-a' AND seq = 2 AND reason = 'bad_signature'"
        ),
        1
    );
    assert_eq!(s.count("SELECT count(*) FROM batches"), 1);

    // The untampered batch still goes in after the rejection.
    let ack = submit(&mut c, &b2).await;
    assert_eq!(ack.status(), AckStatus::Accepted);
    assert_eq!(ack.seq, 2);

    // A gap: batch 4 before 3.
    let _b3 = writer
        .seal("2026-11-29T12:00:10Z", &[record("sbx-1", 4)])
        .unwrap();
    let b4 = writer
        .seal("2026-11-29T12:00:15Z", &[record("sbx-1", 5)])
        .unwrap();
    let ack = submit(&mut c, &b4).await;
    assert_eq!(ack.status(), AckStatus::Rejected);
    assert_eq!(ack.reason, "gap");
}

#[tokio::test]
async fn the_chain_position_survives_a_restart_of_the_consumer() {
    let key = Arc::new(GatewayKey::generate().unwrap());
    let s = served(&key).await;
    let tls = || {
        Identity::load(&s.dir(), "gw-a")
            .unwrap()
            .client_config()
            .unwrap()
    };
    let mut writer = BatchWriter::new(key.clone(), "gw-a");
    let b1 = writer
        .seal("2026-11-29T12:00:00Z", &[record("sbx-2", 1)])
        .unwrap();
    let mut c = client(s.addr, tls()).await.unwrap();
    assert_eq!(submit(&mut c, &b1).await.status(), AckStatus::Accepted);
    // `gateway list` says where the chain stands, for an operator's repair.
    let listed = Store::open(s.db()).unwrap().gateways().unwrap();
    let gw = listed.iter().find(|g| g.id == "gw-a").expect("gw-a listed");
    assert_eq!(gw.chain_last_seq, 1);
    assert_eq!(
        gw.chain_last_digest.as_deref(),
        Some(talos_certs::digest(&b1).as_str())
    );

    // A second consumer on the same store: it knows where the chain is.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let store = Store::open(s.db()).unwrap();
    let server_tls = Identity::load(&s.dir(), "stub")
        .unwrap()
        .server_config()
        .unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    serve(listener, server_tls, store, stopped);
    let mut c2 = client(addr, tls()).await.unwrap();
    assert_eq!(submit(&mut c2, &b1).await.status(), AckStatus::Duplicate);
    let b2 = writer
        .seal("2026-11-29T12:00:05Z", &[record("sbx-2", 2)])
        .unwrap();
    assert_eq!(submit(&mut c2, &b2).await.status(), AckStatus::Accepted);
    let _ = stop.send(());
}

#[tokio::test]
async fn batches_from_an_unregistered_gateway_or_another_key_are_rejected() {
    let key = Arc::new(GatewayKey::generate().unwrap());
    let s = served(&key).await;
    let tls = Identity::load(&s.dir(), "gw-b")
        .unwrap()
        .client_config()
        .unwrap();
    let mut c = client(s.addr, tls).await.unwrap();

    // gw-b has a certificate but no registered key.
    let other = Arc::new(GatewayKey::generate().unwrap());
    let mut writer_b = BatchWriter::new(other.clone(), "gw-b");
    let b = writer_b
        .seal("2026-11-29T12:00:00Z", &[record("sbx-3", 1)])
        .unwrap();
    let ack = submit(&mut c, &b).await;
    assert_eq!(ack.status(), AckStatus::Rejected);
    assert_eq!(ack.reason, "unknown_gateway");

    // gw-a's own batch, well signed, brought by gw-b's certificate.
    let mut writer_a = BatchWriter::new(key.clone(), "gw-a");
    let genuine = writer_a
        .seal("2026-11-29T12:00:00Z", &[record("sbx-3", 1)])
        .unwrap();
    let ack = submit(&mut c, &genuine).await;
    assert_eq!(ack.status(), AckStatus::Rejected);
    assert_eq!(ack.reason, "certificate_mismatch");

    // A batch naming gw-a, brought by gw-a's certificate, but signed with
    // another key.
    let tls_a = Identity::load(&s.dir(), "gw-a")
        .unwrap()
        .client_config()
        .unwrap();
    let mut c_a = client(s.addr, tls_a).await.unwrap();
    let mut forged = BatchWriter::new(other, "gw-a");
    let b = forged
        .seal("2026-11-29T12:00:00Z", &[record("sbx-3", 1)])
        .unwrap();
    let ack = submit(&mut c_a, &b).await;
    assert_eq!(ack.status(), AckStatus::Rejected);
    assert_eq!(ack.reason, "bad_signature");
    assert_eq!(s.count("SELECT count(*) FROM batches"), 0);
    assert_eq!(s.count("SELECT count(*) FROM batch_rejections"), 3);

    // The genuine batch through the right certificate goes in.
    assert_eq!(
        submit(&mut c_a, &genuine).await.status(),
        AckStatus::Accepted
    );

    // A drop report is not a batch.
    let report = talos_certs::DropReport {
        instance: "00000000000000aa".into(),
        gateway_id: "gw-a".into(),
        session_id: "sbx-3".into(),
        attempt: 1,
        ca_digest: talos_certs::sha384_hex(b"ca"),
        secrets: vec![],
        reason: talos_certs::DropReason::End,
        at: "2026-11-29T12:00:00Z".into(),
    };
    let ack = submit(&mut c_a, &report.sign(&key)).await;
    assert_eq!(ack.status(), AckStatus::Rejected);
    assert_eq!(ack.reason, "wrong_kind");
}

#[tokio::test]
async fn a_client_without_a_certificate_or_with_another_cas_cannot_connect() {
    let key = GatewayKey::generate().unwrap();
    let s = served(&key).await;
    let roots = Identity::load(&s.dir(), "stub").unwrap().roots;
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());

    // No client certificate: the server requires one.
    let mut no_cert = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .unwrap()
        .with_root_certificates(roots.clone())
        .with_no_client_auth();
    no_cert.alpn_protocols = vec![b"h2".to_vec()];
    assert_refused(s.addr, no_cert).await;

    // A certificate from another control CA, trusting the right one.
    let other = tempfile::tempdir().unwrap();
    identity::init(other.path(), &["gw-a".into()]).unwrap();
    // Its own certificate and key, trusting the served CA, so that only
    // the client's side is wrong.
    let foreign = Identity::load(other.path(), "gw-a").unwrap();
    let mut mixed = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .unwrap()
        .with_root_certificates(roots)
        .with_client_auth_cert(
            foreign.chain.clone(),
            load_key(&other.path().join("gw-a.key")),
        )
        .unwrap();
    mixed.alpn_protocols = vec![b"h2".to_vec()];
    assert_refused(s.addr, mixed).await;
    assert_eq!(s.count("SELECT count(*) FROM batch_rejections"), 0);
}

fn load_key(path: &Path) -> rustls::pki_types::PrivateKeyDer<'static> {
    use rustls::pki_types::pem::PemObject;
    rustls::pki_types::PrivateKeyDer::from_pem_file(path).unwrap()
}

/// In TLS 1.3 a client learns that its certificate was refused only when
/// it next reads, so the refusal shows at connect or at the first call.
async fn assert_refused(addr: SocketAddr, tls: rustls::ClientConfig) {
    let Ok(mut c) = client(addr, tls).await else {
        return;
    };
    let key = Arc::new(GatewayKey::generate().unwrap());
    let b = BatchWriter::new(key, "gw-a")
        .seal("2026-11-29T12:00:00Z", &[record("sbx-4", 1)])
        .unwrap();
    let got = c.submit_batch(envelope(&b)).await;
    assert!(got.is_err(), "a refused client got an answer: {got:?}");
}

#[test]
fn serve_prints_its_address_accepts_a_batch_and_stops_at_sigterm() {
    use std::io::BufRead as _;
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("control");
    identity::init(&dir, &["gw-a".into()]).unwrap();
    let db = tmp.path().join("stub.db");
    let key = Arc::new(GatewayKey::generate().unwrap());
    Store::open(&db)
        .unwrap()
        .register_gateway("gw-a", &hex::encode(key.public_key()))
        .unwrap();
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_control-stub"))
        .arg("--db")
        .arg(&db)
        .arg("--control-dir")
        .arg(&dir)
        .args(["serve", "--listen", "127.0.0.1:0"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let ready: serde_json::Value = serde_json::from_str(&line).unwrap();
    let addr: SocketAddr = ready["listening"].as_str().unwrap().parse().unwrap();

    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let ack = rt.block_on(async {
        let tls = Identity::load(&dir, "gw-a")
            .unwrap()
            .client_config()
            .unwrap();
        let mut c = client(addr, tls).await.unwrap();
        let b = BatchWriter::new(key.clone(), "gw-a")
            .seal("2026-11-29T12:00:00Z", &[record("sbx-5", 1)])
            .unwrap();
        submit(&mut c, &b).await
    });
    assert_eq!(ack.status(), AckStatus::Accepted);
    // The client's connection goes with its runtime: one left open and
    // never read would keep the drain waiting for its answer to GOAWAY
    // until the grace (`--grace-ms`, 10 s by default).
    drop(rt);

    let killed = std::process::Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        assert!(std::time::Instant::now() < deadline, "serve did not stop");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(status.success(), "{status:?}");
}

/// A store made by an earlier version (its tables only, as that version
/// made them), with one session of that version's shape when it has
/// sessions.
fn old_store(db: &std::path::Path, version: i64) {
    let conn = rusqlite::Connection::open(db).unwrap();
    conn.execute_batch(&talos_control_stub::store::ddl_through(version))
        .unwrap();
    conn.execute_batch(&format!(
        "INSERT INTO sessions (id, tenant, mode, state, created_at, allow, attach, sources)
         VALUES ('sbx-000000000001', 'acme', 'commands', 'paused', '2026-11-29T10:00:00.000Z',
                 '[\"api.github.com\"]', '[]', '[\"10.1.0.2\"]');
         INSERT INTO attempts (session_id, n, cause, started_at, ended_at, end_cause,
                               allowlist, attachments)
         VALUES ('sbx-000000000001', 1, 'launch', '2026-11-29T10:00:00.000Z',
                 '2026-11-29T10:05:00.000Z', 'paused', '[\"api.github.com\"]', '[]');
         INSERT INTO ca_events (session_id, attempt, gateway_id, digest, cert_pem, made_at)
         VALUES ('sbx-000000000001', 1, 'gw-a', 'd', 'pem', '2026-11-29T10:00:00.000Z');
         PRAGMA user_version = {version};"
    ))
    .unwrap();
    // From version 8 the model route is marked passthrough, as version 8's
    // upgrade (or a store made at 8) marks it.
    if version >= 8 {
        conn.execute_batch(
            "INSERT INTO passthrough (name, added_at)
             VALUES ('api.anthropic.com', '2026-11-29T10:00:00.000Z'),
                    ('claude.ai', '2026-11-29T10:00:00.000Z'),
                    ('console.anthropic.com', '2026-11-29T10:00:00.000Z');",
        )
        .unwrap();
    }
    // From version 10 an attempt that ran says when it began to run.
    if version >= 10 {
        conn.execute_batch(
            "UPDATE attempts SET running_at = started_at WHERE session_id = 'sbx-000000000001';",
        )
        .unwrap();
    }
    // From version 7 a session's sources are indexed as it starts.
    if version >= 7 {
        conn.execute_batch(
            "INSERT INTO session_sources (session_id, source)
             VALUES ('sbx-000000000001', '10.1.0.2');",
        )
        .unwrap();
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(db, std::fs::Permissions::from_mode(0o600)).unwrap();
    }
}

#[test]
fn every_earlier_store_is_upgraded_in_place_and_keeps_its_sessions() {
    for version in 1..talos_control_stub::store::SCHEMA_VERSION {
        let tmp = tempfile::tempdir().unwrap();
        let db = tmp.path().join("stub.db");
        old_store(&db, version);
        let store = Store::open(&db).unwrap();
        let status = talos_control_stub::lifecycle::status(&store, "sbx-000000000001").unwrap();
        assert_eq!(status.session.state, talos_control_stub::State::Paused);
        assert_eq!(status.attempts.len(), 1);
        assert!(status.attempts[0].attempt.lock.is_empty());
        assert_eq!(status.attempts[0].attempt.relay_public_key, None);
        // What the CA's process was is unknown for a CA recorded before.
        assert_eq!(status.attempts[0].ca[0].instance, None);
        assert!(status.closes.is_empty());
        assert!(store.lock_list().unwrap().is_empty());
        // The upgrade to version 8 marks the model route passthrough (no
        // rule names it); a store made at 8 keeps the list it had.
        if version < 8 {
            assert_eq!(
                store.passthrough_list().unwrap(),
                ["api.anthropic.com", "claude.ai", "console.anthropic.com"],
                "from {version}"
            );
        }
        // Version 9's push subscriptions: none yet.
        assert!(store.push_subscriptions("alice").unwrap().is_empty());
        assert!(status.attempts[0].attempt.passthrough.is_empty());
        // Version 10: no hard stop, and the attempt, which ended paused,
        // ran from its start.
        assert_eq!(status.session.stop_after_seconds, None);
        assert_eq!(
            status.attempts[0].attempt.running_at.as_deref(),
            Some("2026-11-29T10:00:00.000Z"),
            "from {version}"
        );
        assert_eq!(status.compute_seconds, 300, "from {version}");
        // Its source address is found by the index version 7 added.
        let holder = store
            .read(|tx| tx.live_session_with_source(&["10.1.0.2".parse().unwrap()]))
            .unwrap();
        assert_eq!(
            holder,
            Some(("10.1.0.2".parse().unwrap(), "sbx-000000000001".to_owned())),
            "from {version}"
        );
        // Version 10 rebuilt the sessions table: `failed` is a state now,
        // and the hard stop's range is checked.
        let mut store = store;
        use talos_control_stub::store::Value;
        let id = Value::Text("sbx-000000000001".into());
        let state = "UPDATE sessions SET state = ?2 WHERE id = ?1";
        store
            .test_execute(state, &[id.clone(), Value::Text("failed".into())])
            .unwrap();
        assert!(store
            .test_execute(state, &[id.clone(), Value::Text("bogus".into())])
            .is_err());
        let limit = "UPDATE sessions SET stop_after_seconds = ?2 WHERE id = ?1";
        assert!(store
            .test_execute(limit, &[id.clone(), Value::Int(60)])
            .is_err());
        drop(store);
        let conn = rusqlite::Connection::open(&db).unwrap();
        let v: i64 = conn
            .pragma_query_value(None, "user_version", |r| r.get(0))
            .unwrap();
        assert_eq!(
            v,
            talos_control_stub::store::SCHEMA_VERSION,
            "from {version}"
        );
        for table in [
            "chain_state",
            "proposals",
            "close_tasks",
            "start_reports",
            "certificates",
        ] {
            let n: i64 = conn
                .query_row(&format!("SELECT count(*) FROM {table}"), [], |r| r.get(0))
                .unwrap();
            assert_eq!(n, 0, "{table} from {version}");
        }
        // The rebuilt sessions table takes the new state.
        conn.execute(
            "UPDATE sessions SET state = 'stopping' WHERE id = 'sbx-000000000001'",
            [],
        )
        .unwrap();
    }
}

#[test]
fn init_refuses_gateway_ids_that_are_not_certificate_names() {
    let tmp = tempfile::tempdir().unwrap();
    for bad in ["localhost", "stub", "ca", "control-stub", "gw a", "gw_a!"] {
        let err = identity::init(tmp.path(), &[bad.into()]).unwrap_err();
        assert_eq!(err.code(), "name_invalid", "{bad}");
    }
    let err = identity::init(tmp.path(), &["gw-a".into(), "gw-a".into()]).unwrap_err();
    assert_eq!(err.code(), "name_invalid");
    assert_eq!(std::fs::read_dir(tmp.path()).unwrap().count(), 0);
}
