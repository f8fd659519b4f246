//! People for the end-to-end tests: the web app's certificate from a CA
//! of the test's own, and a person's passkey as a software authenticator
//! (talos-certs' `webauthn::soft`, a test-only feature) driven over the
//! web app's own HTTPS endpoints, as the enrolment and sign-in pages
//! drive a browser's. What runs without a browser (a rig's approvers, the
//! demo) enrols this way; the browser tests (`tests/tests/people.rs`) use
//! Chromium's virtual authenticator instead.
//!
//! The client is blocking (std TCP and rustls, one request a connection):
//! the rigs call it from synchronous code and from tests' async bodies
//! alike ([`crate::rig::blocking`]).

use std::io::{Read as _, Write as _};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use talos_certs::webauthn::soft::{Authenticator, Ceremony};
use talos_certs::webauthn::{CoseAlgorithm, Expected};

use crate::origin::TestCa;

/// The relying party's name: the web app's host in every test.
pub const RP_ID: &str = "people.talos.test";

/// The web app's TLS material: a CA of the test's own (browsers are told
/// to trust it) and a leaf for [`RP_ID`], as files `serve` reads.
#[derive(Debug)]
pub struct WebCert {
    pub ca_pem: String,
    pub cert: PathBuf,
    pub key: PathBuf,
}

impl WebCert {
    /// Make them in `dir` (`web-ca.pem`, `web.pem`, `web.key`).
    pub fn new(dir: &Path) -> WebCert {
        let ca = TestCa::new("people web test CA");
        let (cert_pem, key_pem) = ca.leaf_pem(&[RP_ID]);
        let (cert, key) = (dir.join("web.pem"), dir.join("web.key"));
        std::fs::write(&cert, cert_pem).expect("write web.pem");
        std::fs::write(&key, key_pem).expect("write web.key");
        ca.write_pem(&dir.join("web-ca.pem"));
        WebCert {
            ca_pem: ca.cert_pem,
            cert,
            key,
        }
    }
}

/// A person's passkey: a software authenticator and the sign count its
/// next signature carries.
#[derive(Debug)]
pub struct Passkey {
    pub auth: Authenticator,
    count: AtomicU32,
}

impl Default for Passkey {
    fn default() -> Passkey {
        Passkey {
            auth: Authenticator::new(CoseAlgorithm::Es256),
            count: AtomicU32::new(0),
        }
    }
}

impl Passkey {
    /// A right assertion over `challenge` for `origin`, the count one more.
    pub fn sign(&self, origin: &str, challenge: &[u8]) -> serde_json::Value {
        let n = self.count.fetch_add(1, Ordering::SeqCst) + 1;
        let expected = Expected {
            challenge,
            rp_id: RP_ID,
            origin,
        };
        let a = self.auth.assert(&Ceremony::get(&expected).sign_count(n));
        serde_json::json!({
            "id": URL_SAFE_NO_PAD.encode(&a.credential_id),
            "response": {
                "authenticatorData": URL_SAFE_NO_PAD.encode(&a.authenticator_data),
                "clientDataJSON": URL_SAFE_NO_PAD.encode(&a.client_data_json),
                "signature": URL_SAFE_NO_PAD.encode(&a.signature),
                "userHandle": null,
            },
        })
    }
}

/// An answer.
#[derive(Debug)]
pub struct Answer {
    pub status: u16,
    pub head: String,
    pub body: serde_json::Value,
}

impl Answer {
    pub fn code(&self) -> &str {
        self.body["error"].as_str().unwrap_or("")
    }
}

/// The web app as the app's own pages reach it: TLS 1.3 trusting the
/// test's CA, the name in SNI, the app's Origin, its cookie and CSRF
/// token kept.
#[derive(Debug, Clone)]
pub struct WebClient {
    addr: SocketAddr,
    tls: Arc<rustls::ClientConfig>,
    pub origin: String,
    pub cookie: Option<String>,
    pub csrf: Option<String>,
}

impl WebClient {
    pub fn new(addr: SocketAddr, ca_pem: &str, origin: &str) -> WebClient {
        let mut roots = rustls::RootCertStore::empty();
        for c in rustls_pemfile::certs(&mut ca_pem.as_bytes()) {
            roots.add(c.expect("CA PEM")).expect("CA");
        }
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let tls = rustls::ClientConfig::builder_with_provider(provider)
            .with_protocol_versions(&[&rustls::version::TLS13])
            .expect("TLS 1.3")
            .with_root_certificates(roots)
            .with_no_client_auth();
        WebClient {
            addr,
            tls: Arc::new(tls),
            origin: origin.to_owned(),
            cookie: None,
            csrf: None,
        }
    }

    /// One request (`Connection: close`), as the page makes it.
    pub fn call(&mut self, method: &str, path: &str, body: Option<&serde_json::Value>) -> Answer {
        let name = rustls::pki_types::ServerName::try_from(RP_ID).expect("name");
        let conn = rustls::ClientConnection::new(self.tls.clone(), name).expect("TLS");
        let tcp = std::net::TcpStream::connect_timeout(&self.addr, Duration::from_secs(10))
            .expect("connect to the web app");
        tcp.set_read_timeout(Some(Duration::from_secs(30))).ok();
        let mut tls = rustls::StreamOwned::new(conn, tcp);
        let body = body.map(|b| b.to_string()).unwrap_or_default();
        let mut head = format!(
            "{method} {path} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\nContent-Length: {}\r\n",
            self.origin.trim_start_matches("https://"),
            body.len()
        );
        if method != "GET" {
            head.push_str(&format!(
                "Origin: {}\r\nContent-Type: application/json\r\nSec-Fetch-Site: same-origin\r\n",
                self.origin
            ));
            if let Some(t) = &self.csrf {
                head.push_str(&format!("X-CSRF-Token: {t}\r\n"));
            }
        }
        if let Some(c) = &self.cookie {
            head.push_str(&format!("Cookie: __Host-talos_session={c}\r\n"));
        }
        head.push_str("\r\n");
        tls.write_all(head.as_bytes()).expect("write request");
        tls.write_all(body.as_bytes()).expect("write body");
        let mut raw = Vec::new();
        let _ = tls.read_to_end(&mut raw);
        let text = String::from_utf8_lossy(&raw).into_owned();
        let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
        let status = head
            .split(' ')
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or(0);
        for line in head.lines() {
            let Some(v) = line
                .strip_prefix("set-cookie: ")
                .or_else(|| line.strip_prefix("Set-Cookie: "))
            else {
                continue;
            };
            let value = v
                .split(';')
                .next()
                .and_then(|kv| kv.split_once('='))
                .map(|(_, v)| v.to_owned())
                .unwrap_or_default();
            self.cookie = (!value.is_empty()).then_some(value);
        }
        let body: serde_json::Value = serde_json::from_str(body).unwrap_or(serde_json::Value::Null);
        if let Some(t) = body.get("csrf").and_then(|v| v.as_str()) {
            self.csrf = Some(t.to_owned());
        }
        Answer {
            status,
            head: head.to_owned(),
            body,
        }
    }

    pub fn get(&mut self, path: &str) -> Answer {
        self.call("GET", path, None)
    }

    pub fn post(&mut self, path: &str, body: serde_json::Value) -> Answer {
        self.call("POST", path, Some(&body))
    }

    /// Enrol a new software passkey with the enrolment `link`, as the
    /// enrolment page does.
    pub fn enrol(&mut self, link: &str) -> Passkey {
        let token = link
            .split_once("/enrol#")
            .expect("an enrolment link")
            .1
            .to_owned();
        let options = self.post("/api/enrol/begin", serde_json::json!({"token": token}));
        assert_eq!(options.status, 200, "enrolment options: {:?}", options.body);
        let challenge = URL_SAFE_NO_PAD
            .decode(
                options.body["publicKey"]["challenge"]
                    .as_str()
                    .expect("challenge"),
            )
            .expect("base64url");
        let passkey = Passkey::default();
        let origin = self.origin.clone();
        let expected = Expected {
            challenge: &challenge,
            rp_id: RP_ID,
            origin: &origin,
        };
        let made = passkey.auth.register(&Ceremony::create(&expected));
        let done = self.post(
            "/api/enrol/finish",
            serde_json::json!({
                "token": token,
                "challenge_id": options.body["challenge_id"],
                "credential": {
                    "id": URL_SAFE_NO_PAD.encode(passkey.auth.credential_id()),
                    "response": {
                        "attestationObject": URL_SAFE_NO_PAD.encode(&made.attestation_object),
                        "clientDataJSON": URL_SAFE_NO_PAD.encode(&made.client_data_json),
                    },
                },
            }),
        );
        assert_eq!(done.status, 200, "enrolment: {:?}", done.body);
        passkey
    }

    /// Sign in with `passkey`, as the sign-in page does.
    pub fn sign_in(&mut self, passkey: &Passkey) -> Answer {
        let begun = self.post("/api/sign-in/begin", serde_json::json!({}));
        assert_eq!(begun.status, 200, "sign-in: {:?}", begun.body);
        let challenge = URL_SAFE_NO_PAD
            .decode(
                begun.body["publicKey"]["challenge"]
                    .as_str()
                    .expect("challenge"),
            )
            .expect("base64url");
        let origin = self.origin.clone();
        self.post(
            "/api/sign-in/finish",
            serde_json::json!({
                "challenge_id": begun.body["challenge_id"],
                "credential": passkey.sign(&origin, &challenge),
            }),
        )
    }
}

/// What a person does in the browser, step by step: the tests and the
/// screenshots share these.
pub mod steps {
    use crate::browser::{Error, Page};

    /// Open the enrolment `link` and create the passkey (the page's
    /// authenticator verifies the user).
    pub async fn enrol(page: &Page, link: &str) -> Result<(), Error> {
        page.goto(link).await?;
        page.wait_until(
            "document.body.dataset.ready === 'yes'",
            "the enrolment page to check its link",
        )
        .await?;
        page.click("#enrol").await?;
        page.wait_until(
            "!document.getElementById('next').hidden",
            "the passkey to be saved",
        )
        .await
    }

    /// Sign in at `origin` with the page's passkey; the cards page shows.
    pub async fn sign_in(page: &Page, origin: &str) -> Result<(), Error> {
        page.goto(&format!("{origin}/")).await?;
        page.wait_until("document.body.dataset.ready === 'yes'", "the sign-in page")
            .await?;
        page.click("#sign-in").await?;
        across_navigation(
            page,
            "location.pathname === '/cards' && document.body.dataset.ready === 'yes'",
            "the cards page after signing in",
        )
        .await
    }

    /// [`Page::wait_until`] on a page that navigates meanwhile: the wait
    /// is asked again in the new document (a navigation ends the page's
    /// evaluation), a few times at most.
    pub async fn across_navigation(page: &Page, condition: &str, what: &str) -> Result<(), Error> {
        let mut tries = 0;
        loop {
            match page.wait_until(condition, what).await {
                Err(Error::Protocol { message, .. })
                    if message.contains("navigated or closed")
                        || message.contains("context was destroyed")
                        || message.contains("Cannot find context") =>
                {
                    tries += 1;
                    if tries >= 5 {
                        return Err(Error::Page(format!("{what}: the page kept navigating")));
                    }
                }
                other => return other,
            }
        }
    }

    /// Open `path` of `origin` and wait until its page has loaded what it
    /// shows.
    pub async fn open(page: &Page, origin: &str, path: &str) -> Result<(), Error> {
        page.goto(&format!("{origin}{path}")).await?;
        page.wait_until(
            "document.body.dataset.ready === 'yes'",
            &format!("{path} to load"),
        )
        .await
    }
}

/// A `ControlPlane` client presenting gateway `id`'s identity from the
/// control directory `dir`: a member's proposals, or a compromised
/// member's.
pub fn control_plane_client(
    dir: &Path,
    id: &str,
    addr: SocketAddr,
) -> talos_gateway::pb::control_plane_client::ControlPlaneClient<tonic::transport::Channel> {
    use rustls::pki_types::pem::PemObject as _;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let read = |name: &str| std::fs::read(dir.join(name)).expect("control file");
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_slice_iter(&read("ca.pem")) {
        roots.add(c.expect("PEM")).expect("anchor");
    }
    let chain = CertificateDer::pem_slice_iter(&read(&format!("{id}.pem")))
        .collect::<Result<Vec<_>, _>>()
        .expect("cert PEM");
    let key = PrivateKeyDer::from_pem_slice(&read(&format!("{id}.key"))).expect("key PEM");
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .expect("TLS 1.3")
        .with_root_certificates(roots)
        .with_client_auth_cert(chain, key)
        .expect("client certificate");
    config.alpn_protocols = vec![b"h2".to_vec()];
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let name = rustls::pki_types::ServerName::try_from("control-stub").expect("name");
    let connect = tower::service_fn(move |_uri: hyper::Uri| {
        let connector = connector.clone();
        let name = name.clone();
        async move {
            let tcp = tokio::net::TcpStream::connect(addr).await?;
            let tls = connector.connect(name, tcp).await?;
            Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(tls))
        }
    });
    let channel = tonic::transport::Endpoint::from_static("https://control-stub")
        .connect_timeout(Duration::from_secs(10))
        .timeout(Duration::from_secs(30))
        .connect_with_connector_lazy(connect);
    talos_gateway::pb::control_plane_client::ControlPlaneClient::new(channel)
}

/// An agent's proposal from `gw-a` for approver alice under `rule`, its
/// tool named `tool` (a card's text as an agent, or a compromised gateway,
/// could write it), deciding within five minutes: what the browser tests
/// and the screenshots send the relay as `ControlPlane.Propose`.
pub fn agent_card(
    proposal_id: &str,
    session_id: &str,
    rule: &str,
    tool: &str,
) -> talos_certs::Proposal {
    let at = |secs: u64| {
        humantime::format_rfc3339_millis(std::time::SystemTime::now() + Duration::from_secs(secs))
            .to_string()
    };
    talos_certs::Proposal {
        proposal_id: proposal_id.into(),
        gateway_id: "gw-a".into(),
        session_id: session_id.into(),
        attempt: 1,
        tenant: "acme".into(),
        kind: talos_certs::ProposalKind::Agent,
        destination: String::new(),
        method: String::new(),
        path: String::new(),
        attachments: Vec::new(),
        rule: rule.into(),
        tool: tool.into(),
        call_digest: "ab".repeat(48),
        approvers: vec!["alice".into()],
        created_at: at(0),
        expires_at: at(300),
    }
}
