//! People for the tests: a person enrolled through the real ceremony with
//! a software authenticator (talos-certs' `webauthn::soft`, a test-only
//! feature), and the web app served in process with an HTTPS client of
//! the tests' own that signs in and signs as a browser would.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, KeyUsagePurpose};
use talos_certs::webauthn::soft::{Authenticator, Ceremony};
use talos_certs::webauthn::{CoseAlgorithm, Expected};
use talos_control_stub::model::Role;
use talos_control_stub::people::web::{Deps, Running, WebConfig};
use talos_control_stub::people::{accounts, ceremony, rp::RelyingParty};
use talos_control_stub::store::Db;
use talos_control_stub::Store;

/// The relying party's name in the tests.
pub const RP_ID: &str = "people.talos.test";

/// The origin the store-level helpers enrol under.
pub const ORIGIN: &str = "https://people.talos.test";

/// A person's passkey: the authenticator, and the sign count it signs
/// with next (each signature one more, as a real authenticator counts).
pub struct Passkey {
    pub auth: Authenticator,
    pub count: AtomicU32,
}

impl Passkey {
    pub fn new() -> Passkey {
        Passkey {
            auth: Authenticator::new(CoseAlgorithm::Es256),
            count: AtomicU32::new(0),
        }
    }

    /// Sign `challenge` for `rp`: a right assertion, the count one more.
    pub fn sign(&self, rp: &RelyingParty, challenge: &[u8]) -> serde_json::Value {
        let n = self.count.fetch_add(1, Ordering::SeqCst) + 1;
        let expected = Expected {
            challenge,
            rp_id: rp.rp_id(),
            origin: rp.origin(),
        };
        assertion_json(&self.auth.assert(&Ceremony::get(&expected).sign_count(n)))
    }

    /// Sign with a ceremony a test changed (wrong origin, no UV, …).
    pub fn sign_with(&self, ceremony: &Ceremony) -> serde_json::Value {
        assertion_json(&self.auth.assert(ceremony))
    }
}

/// An assertion as the page posts it.
pub fn assertion_json(a: &talos_certs::webauthn::soft::SignedAssertion) -> serde_json::Value {
    serde_json::json!({
        "id": URL_SAFE_NO_PAD.encode(&a.credential_id),
        "response": {
            "authenticatorData": URL_SAFE_NO_PAD.encode(&a.authenticator_data),
            "clientDataJSON": URL_SAFE_NO_PAD.encode(&a.client_data_json),
            "signature": URL_SAFE_NO_PAD.encode(&a.signature),
            "userHandle": a.user_handle.as_ref().map(|h| URL_SAFE_NO_PAD.encode(h)),
        },
    })
}

/// The token in an enrolment link.
pub fn token_of(link: &str) -> String {
    link.split_once("/enrol#")
        .expect("an enrolment link")
        .1
        .to_owned()
}

/// Enrol `name` with `role` in `store` through the ceremony's own steps
/// (the link made, its token taken by the options, the software
/// authenticator's registration checked and stored): what the web app's
/// enrolment endpoints run, without the HTTP around them.
pub fn enrolled(store: &mut Store, name: &str, role: Role) -> Passkey {
    let rp = RelyingParty::new(ORIGIN, RP_ID).unwrap();
    let now = SystemTime::now();
    let link = accounts::enroll(store, name, role, ORIGIN, now).unwrap();
    let token = token_of(&link.link);
    let options = ceremony::enrol_begin(store, &rp, &token, "127.0.0.1", now).unwrap();
    let challenge = URL_SAFE_NO_PAD
        .decode(options["publicKey"]["challenge"].as_str().unwrap())
        .unwrap();
    let passkey = Passkey::new();
    let expected = Expected {
        challenge: &challenge,
        rp_id: RP_ID,
        origin: ORIGIN,
    };
    let made = passkey.auth.register(&Ceremony::create(&expected));
    let answer: ceremony::RegistrationJson =
        serde_json::from_value(registration_json(&passkey.auth, &made)).unwrap();
    ceremony::enrol_finish(
        store,
        &rp,
        &token,
        options["challenge_id"].as_str().unwrap(),
        &answer,
        now,
    )
    .unwrap();
    passkey
}

/// A registration as the page posts it.
pub fn registration_json(
    auth: &Authenticator,
    made: &talos_certs::webauthn::soft::Registration,
) -> serde_json::Value {
    serde_json::json!({
        "id": URL_SAFE_NO_PAD.encode(auth.credential_id()),
        "response": {
            "attestationObject": URL_SAFE_NO_PAD.encode(&made.attestation_object),
            "clientDataJSON": URL_SAFE_NO_PAD.encode(&made.client_data_json),
        },
    })
}

/// A test CA and a leaf for [`RP_ID`], written as PEM files in `dir`.
pub struct WebCa {
    pub ca_pem: String,
    pub cert: std::path::PathBuf,
    pub key: std::path::PathBuf,
}

impl WebCa {
    pub fn new(dir: &Path) -> WebCa {
        let ca_key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params
            .distinguished_name
            .push(DnType::CommonName, "people test CA");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let ca = params.self_signed(&ca_key).unwrap();
        let leaf_key = KeyPair::generate().unwrap();
        let leaf = CertificateParams::new(vec![RP_ID.to_owned()])
            .unwrap()
            .signed_by(&leaf_key, &Issuer::from_params(&params, &ca_key))
            .unwrap();
        let (cert, key) = (dir.join("web.pem"), dir.join("web.key"));
        std::fs::write(&cert, leaf.pem()).unwrap();
        std::fs::write(&key, leaf_key.serialize_pem()).unwrap();
        WebCa {
            ca_pem: ca.pem(),
            cert,
            key,
        }
    }
}

/// A clock a test moves.
#[derive(Clone)]
pub struct TestClock(Arc<Mutex<SystemTime>>);

impl TestClock {
    pub fn new() -> TestClock {
        TestClock(Arc::new(Mutex::new(SystemTime::now())))
    }

    pub fn advance(&self, by: Duration) {
        *self.0.lock().unwrap() += by;
    }

    pub fn now(&self) -> SystemTime {
        *self.0.lock().unwrap()
    }

    pub fn clock(&self) -> talos_control_stub::people::web::Clock {
        let c = self.0.clone();
        Arc::new(move || *c.lock().unwrap())
    }
}

/// The web app in process, on 127.0.0.1:0, its origin
/// `https://people.talos.test:PORT`.
pub struct Web {
    pub running: Option<Running>,
    pub addr: SocketAddr,
    pub rp: RelyingParty,
    pub ca_pem: String,
}

impl Web {
    /// Start it on `db` with `link` (the gateways) and `clock`. The port
    /// is bound first, so the origin can name it.
    pub async fn start(
        dir: &Path,
        db: &Db,
        link: Arc<dyn talos_control_stub::link::GatewayLink + Send + Sync>,
        clock: talos_control_stub::people::web::Clock,
    ) -> Web {
        Web::start_with(dir, db, link, clock, None).await
    }

    /// [`Web::start`], with Web Push on (`push`).
    pub async fn start_with(
        dir: &Path,
        db: &Db,
        link: Arc<dyn talos_control_stub::link::GatewayLink + Send + Sync>,
        clock: talos_control_stub::people::web::Clock,
        push: Option<(
            talos_control_stub::people::push::PushConfig,
            talos_control_stub::identity::VapidKey,
        )>,
    ) -> Web {
        let ca = WebCa::new(dir);
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let origin = format!("https://{RP_ID}:{port}");
        let rp = RelyingParty::new(&origin, RP_ID).unwrap();
        let config = WebConfig {
            listen: listener.local_addr().unwrap(),
            rp: rp.clone(),
            cert: ca.cert.clone(),
            key: ca.key.clone(),
            push: push.as_ref().map(|(c, _)| c.clone()),
            operators: None,
        };
        let bound = config.bind_on(listener).unwrap();
        let addr = bound.local_addr();
        let running = bound
            .start(Deps {
                db: db.clone(),
                relay_key: Arc::new(talos_certs::GatewayKey::generate().unwrap()),
                links: talos_control_stub::people::web::fixed_link(link),
                verifier: Arc::new(talos_control_stub::FakeVerifier::accepting()),
                vapid: push.map(|(_, k)| k),
                clock,
            })
            .await
            .unwrap();
        Web {
            running: Some(running),
            addr,
            rp,
            ca_pem: ca.ca_pem,
        }
    }

    /// A browser with no cookie yet.
    pub fn client(&self) -> Client {
        Client::new(self.addr, &self.ca_pem, self.rp.origin())
    }

    pub async fn stop(&mut self) {
        if let Some(r) = self.running.take() {
            r.stop(Duration::from_secs(2)).await;
        }
    }
}

/// An answer.
#[derive(Debug)]
pub struct Answer {
    pub status: u16,
    pub headers: hyper::HeaderMap,
    pub body: serde_json::Value,
    pub text: String,
}

impl Answer {
    pub fn code(&self) -> &str {
        self.body["error"].as_str().unwrap_or("")
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }
}

/// A browser as far as the web app can tell: TLS 1.3 trusting the tests'
/// CA, the name in SNI, the app's Origin on every POST, the session cookie
/// kept from `Set-Cookie`, the CSRF token from sign-in or `/api/me`.
#[derive(Clone)]
pub struct Client {
    addr: SocketAddr,
    tls: Arc<rustls::ClientConfig>,
    pub origin: String,
    /// The address its connections come from (127.0.0.1 unless set).
    pub source: std::net::Ipv4Addr,
    pub cookie: Option<String>,
    pub csrf: Option<String>,
    /// Every `Set-Cookie` seen, as received.
    pub set_cookies: Vec<String>,
}

impl Client {
    pub fn new(addr: SocketAddr, ca_pem: &str, origin: &str) -> Client {
        let mut roots = rustls::RootCertStore::empty();
        for c in rustls_pemfile::certs(&mut ca_pem.as_bytes()) {
            roots.add(c.unwrap()).unwrap();
        }
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let mut tls = rustls::ClientConfig::builder_with_provider(provider)
            .with_protocol_versions(&[&rustls::version::TLS13])
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
        tls.alpn_protocols = vec![b"http/1.1".to_vec()];
        Client {
            addr,
            tls: Arc::new(tls),
            origin: origin.to_owned(),
            source: std::net::Ipv4Addr::LOCALHOST,
            cookie: None,
            csrf: None,
            set_cookies: Vec::new(),
        }
    }

    /// One TLS connection to the app.
    pub async fn connect(&self) -> tokio_rustls::client::TlsStream<tokio::net::TcpStream> {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.bind((self.source, 0).into()).unwrap();
        let tcp = socket.connect(self.addr).await.unwrap();
        let name = rustls::pki_types::ServerName::try_from(RP_ID).unwrap();
        tokio_rustls::TlsConnector::from(self.tls.clone())
            .connect(name, tcp)
            .await
            .unwrap()
    }

    /// A request as the app's own page makes it.
    pub async fn call(
        &mut self,
        method: &str,
        path: &str,
        body: Option<serde_json::Value>,
    ) -> Answer {
        let mut headers = vec![];
        if method != "GET" {
            headers.push(("origin".to_owned(), self.origin.clone()));
            headers.push(("content-type".to_owned(), "application/json".to_owned()));
            headers.push(("sec-fetch-site".to_owned(), "same-origin".to_owned()));
            if let Some(t) = &self.csrf {
                headers.push(("x-csrf-token".to_owned(), t.clone()));
            }
        }
        let body = body.map(|b| b.to_string()).unwrap_or_else(|| {
            if method == "GET" {
                String::new()
            } else {
                "{}".into()
            }
        });
        self.raw(method, path, &headers, body.into_bytes()).await
    }

    pub async fn get(&mut self, path: &str) -> Answer {
        self.call("GET", path, None).await
    }

    pub async fn post(&mut self, path: &str, body: serde_json::Value) -> Answer {
        self.call("POST", path, Some(body)).await
    }

    /// A request with exactly these headers (and the cookie, if any).
    pub async fn raw(
        &mut self,
        method: &str,
        path: &str,
        headers: &[(String, String)],
        body: Vec<u8>,
    ) -> Answer {
        let tls = self.connect().await;
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
            .await
            .unwrap();
        tokio::spawn(conn);
        let mut req = hyper::Request::builder()
            .method(method)
            .uri(path)
            .header("host", self.origin.trim_start_matches("https://"));
        if let Some(c) = &self.cookie {
            req = req.header("cookie", format!("__Host-talos_session={c}"));
        }
        for (k, v) in headers {
            req = req.header(k.as_str(), v.as_str());
        }
        let req = req.body(Full::new(bytes::Bytes::from(body))).unwrap();
        let resp = tokio::time::timeout(Duration::from_secs(30), sender.send_request(req))
            .await
            .expect("an answer in time")
            .unwrap();
        let status = resp.status().as_u16();
        let headers = resp.headers().clone();
        for v in headers.get_all("set-cookie") {
            let v = v.to_str().unwrap().to_owned();
            let value = v
                .split(';')
                .next()
                .and_then(|kv| kv.split_once('='))
                .map(|(_, v)| v.to_owned())
                .unwrap_or_default();
            self.cookie = (!value.is_empty()).then_some(value);
            self.set_cookies.push(v);
        }
        let bytes = tokio::time::timeout(Duration::from_secs(30), resp.into_body().collect())
            .await
            .expect("a body in time")
            .unwrap()
            .to_bytes();
        let text = String::from_utf8_lossy(&bytes).into_owned();
        let body = serde_json::from_str(&text).unwrap_or(serde_json::Value::Null);
        if let Some(csrf) = body.get("csrf").and_then(|v| v.as_str()) {
            self.csrf = Some(csrf.to_owned());
        }
        Answer {
            status,
            headers,
            body,
            text,
        }
    }

    /// Open the enrolment `link` and create a passkey with a software
    /// authenticator, as the enrolment page does.
    pub async fn enrol(&mut self, rp: &RelyingParty, link: &str) -> Passkey {
        let token = token_of(link);
        let options = self
            .post("/api/enrol/begin", serde_json::json!({"token": token}))
            .await;
        assert_eq!(options.status, 200, "{}", options.text);
        let pk = &options.body["publicKey"];
        assert_eq!(pk["authenticatorSelection"]["residentKey"], "required");
        assert_eq!(pk["authenticatorSelection"]["userVerification"], "required");
        assert_eq!(pk["attestation"], "none");
        let challenge = URL_SAFE_NO_PAD
            .decode(pk["challenge"].as_str().unwrap())
            .unwrap();
        let passkey = Passkey::new();
        let expected = Expected {
            challenge: &challenge,
            rp_id: rp.rp_id(),
            origin: rp.origin(),
        };
        let made = passkey.auth.register(&Ceremony::create(&expected));
        let done = self
            .post(
                "/api/enrol/finish",
                serde_json::json!({
                    "token": token,
                    "challenge_id": options.body["challenge_id"],
                    "credential": registration_json(&passkey.auth, &made),
                }),
            )
            .await;
        assert_eq!(done.status, 200, "{}", done.text);
        passkey
    }

    /// Sign in with `passkey`, as the sign-in page does.
    pub async fn sign_in(&mut self, rp: &RelyingParty, passkey: &Passkey) -> Answer {
        let begun = self.post("/api/sign-in/begin", serde_json::json!({})).await;
        assert_eq!(begun.status, 200, "{}", begun.text);
        let challenge = URL_SAFE_NO_PAD
            .decode(begun.body["publicKey"]["challenge"].as_str().unwrap())
            .unwrap();
        self.post(
            "/api/sign-in/finish",
            serde_json::json!({
                "challenge_id": begun.body["challenge_id"],
                "credential": passkey.sign(rp, &challenge),
            }),
        )
        .await
    }

    /// Decide card `card` (its JSON from `/api/cards`) with `verdict`,
    /// signing the challenge the card gives for `signed_verdict`.
    pub async fn decide(
        &mut self,
        rp: &RelyingParty,
        passkey: &Passkey,
        card: &serde_json::Value,
        verdict: &str,
        signed_verdict: &str,
    ) -> Answer {
        let challenge = URL_SAFE_NO_PAD
            .decode(card["challenges"][signed_verdict].as_str().unwrap())
            .unwrap();
        let id = card["id"].as_str().unwrap();
        self.post(
            &format!("/api/cards/{id}/decision"),
            serde_json::json!({"verdict": verdict, "credential": passkey.sign(rp, &challenge)}),
        )
        .await
    }
}

/// The challenge a decision signs, computed as the gateway and an auditor
/// do.
pub fn decision_challenge(digest: &str, verdict: talos_certs::Verdict) -> [u8; 32] {
    talos_certs::webauthn::decision_challenge(digest, verdict)
}

/// Enrol each of `names` that holds no passkey yet, as an approver (a
/// Lock rule may name only people who hold one).
pub fn enrol_all(store: &mut Store, names: &[&str]) {
    for name in names {
        let held = store.read(|tx| tx.enrolled(&[(*name).to_owned()])).unwrap();
        if held.is_empty() {
            enrolled(store, name, Role::Approver);
        }
    }
}

/// A live card stream (`GET /api/events`), read event by event.
pub struct Events {
    body: hyper::body::Incoming,
    buf: String,
}

impl Events {
    /// The next event (name, data), skipping comments and `retry`; `None`
    /// when the stream ends or nothing comes `within`.
    pub async fn next(&mut self, within: Duration) -> Option<(String, serde_json::Value)> {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            if let Some(end) = self.buf.find("\n\n") {
                let block: String = self.buf.drain(..end + 2).collect();
                let mut name = None;
                let mut data = None;
                for line in block.lines() {
                    if let Some(n) = line.strip_prefix("event: ") {
                        name = Some(n.to_owned());
                    } else if let Some(d) = line.strip_prefix("data: ") {
                        data = Some(serde_json::from_str(d).unwrap());
                    }
                }
                if let (Some(n), Some(d)) = (name, data) {
                    return Some((n, d));
                }
                continue;
            }
            let frame = tokio::time::timeout_at(deadline, self.body.frame())
                .await
                .ok()??;
            if let Ok(data) = frame.ok()?.into_data() {
                self.buf.push_str(std::str::from_utf8(&data).unwrap());
            }
        }
    }
}

impl Client {
    /// Open the live card stream: its status, and the stream when 200.
    pub async fn events(&mut self) -> (u16, Option<Events>) {
        let tls = self.connect().await;
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
            .await
            .unwrap();
        tokio::spawn(conn);
        let mut req = hyper::Request::builder()
            .uri("/api/events")
            .header("host", self.origin.trim_start_matches("https://"));
        if let Some(c) = &self.cookie {
            req = req.header("cookie", format!("__Host-talos_session={c}"));
        }
        let resp = sender
            .send_request(req.body(Full::new(bytes::Bytes::new())).unwrap())
            .await
            .unwrap();
        let status = resp.status().as_u16();
        if status != 200 {
            return (status, None);
        }
        (
            status,
            Some(Events {
                body: resp.into_body(),
                buf: String::new(),
            }),
        )
    }
}
