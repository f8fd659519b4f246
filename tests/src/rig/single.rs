//! One gateway and what is behind it: the origins and DNS server a test
//! puts there, and either one static session (its CA written to
//! `dir/session-ca.pem` at start, all its clients trust) or a control
//! channel the test plays the control plane on (a control CA, and with a
//! relay, a control plane taking the gateway's batches and proposals).
//!
//! [`SingleBuilder`] holds what the tests vary: the session (its id,
//! sources, allowlist, attachments), the secrets, `[limits]`, the
//! runtime's workers, and the control channel.

use std::net::SocketAddr;
use std::path::PathBuf;

use talos_gateway::pb;
use tonic::transport::Channel;

use super::Process;
use crate::clients::{http, Curl, Curled, SESSION_SOURCE};
use crate::control::{gateway_client, ControlPki};
use crate::gateway::{records_path, Gateway, TestConfig, TestSession};
use crate::origin::LoopbackOrigin;
use crate::relay::Relay;

/// What a [`Single`] is started with.
#[derive(Debug, Clone, Default)]
pub struct SingleBuilder {
    session: Option<TestSession>,
    limits: String,
    workers: Option<Option<usize>>,
    secrets: Vec<(String, String)>,
    control: bool,
    relay: bool,
    /// The `[dns]` table's lines.
    answerer: String,
    /// More static sessions beside the first.
    more_sessions: Vec<TestSession>,
}

/// The gateway (a [`Gateway`], or a [`crate::member::Member`]), in `dir`,
/// and what is behind it; stopped when it drops.
#[derive(Debug)]
pub struct Single<G: Process = Gateway, P = LoopbackOrigin> {
    // Fields drop in this order: the gateway stops before its control
    // plane, its peers and its folder go.
    pub gateway: G,
    relay: Option<Relay>,
    pki: Option<ControlPki>,
    /// What is behind the gateway: origins, a DNS server.
    pub peers: P,
    pub dir: PathBuf,
    /// The static session's CA, as the gateway wrote it at start: all its
    /// clients trust.
    pub trust: PathBuf,
    /// The config the gateway was started with.
    config: TestConfig,
    _tmp: tempfile::TempDir,
}

impl Single {
    /// No session, no control channel, `[limits]` empty.
    pub fn builder() -> SingleBuilder {
        SingleBuilder::default()
    }
}

impl SingleBuilder {
    /// One static session, `sess-1`, from [`SESSION_SOURCE`] allowed to
    /// reach `allowlist`.
    pub fn session(mut self, allowlist: &[&str]) -> Self {
        self.session = Some(TestSession {
            id: "sess-1".into(),
            sources: vec![SESSION_SOURCE.into()],
            allowlist: allowlist.iter().map(|s| (*s).to_owned()).collect(),
            ..Default::default()
        });
        self
    }

    fn session_mut(&mut self) -> &mut TestSession {
        self.session.as_mut().expect("session() first")
    }

    /// The session's id, in place of `sess-1`.
    pub fn session_id(mut self, id: &str) -> Self {
        self.session_mut().id = id.to_owned();
        self
    }

    /// The session's sources, in place of [`SESSION_SOURCE`].
    pub fn sources(mut self, sources: &[&str]) -> Self {
        self.session_mut().sources = sources.iter().map(|s| (*s).to_owned()).collect();
        self
    }

    /// The session's attachments (`SECRET=destination:header[:scheme]`).
    pub fn attach(mut self, attach: &[&str]) -> Self {
        self.session_mut().attach = attach.iter().map(|s| (*s).to_owned()).collect();
        self
    }

    /// Another static session, `id`, from `source`, allowed `allowlist`
    /// (its CA written to `dir/<id>-ca.pem`).
    pub fn also_session(mut self, id: &str, source: &str, allowlist: &[&str]) -> Self {
        self.more_sessions.push(TestSession {
            id: id.to_owned(),
            sources: vec![source.to_owned()],
            allowlist: allowlist.iter().map(|s| (*s).to_owned()).collect(),
            ..Default::default()
        });
        self
    }

    /// The sessions' DNS answerer: the `[dns]` table's `lines`.
    pub fn answerer(mut self, lines: &str) -> Self {
        self.answerer = lines.to_owned();
        self
    }

    /// A secret, read from `dir/<file>` (the test writes it first).
    pub fn secret(mut self, name: &str, file: &str) -> Self {
        self.secrets.push((name.to_owned(), file.to_owned()));
        self
    }

    /// The `[limits]` lines.
    pub fn limits(mut self, limits: &str) -> Self {
        self.limits = limits.to_owned();
        self
    }

    /// `runtime.workers` (`None`: one per CPU), in place of the test
    /// run's ([`crate::gateway::test_workers`]).
    pub fn workers(mut self, workers: Option<usize>) -> Self {
        self.workers = Some(workers);
        self
    }

    /// A control channel: a control CA in `dir`, the gateway's `[control]`
    /// table, a client ([`Single::client`]) with the control plane's
    /// certificate.
    pub fn control(mut self) -> Self {
        self.control = true;
        self
    }

    /// A control channel and a [`Relay`] as the control plane the gateway
    /// ships its batches and proposals to.
    pub fn relay(mut self) -> Self {
        self.control = true;
        self.relay = true;
        self
    }

    /// Start it behind one origin serving `names` (see
    /// [`LoopbackOrigin::serving`]).
    pub async fn start_loopback<G: Process>(self, names: &[&str]) -> Single<G> {
        let (tmp, peers, base) = super::loopback(names).await;
        self.start(tmp, peers, base).await
    }

    /// Start it in `tmp`, behind `peers`, its config from `base` (what
    /// reaches the peers).
    pub async fn start<G: Process, P>(
        self,
        tmp: tempfile::TempDir,
        peers: P,
        base: TestConfig,
    ) -> Single<G, P> {
        let dir = tmp.path().to_owned();
        let trust = dir.join("session-ca.pem");
        let pki = self.control.then(|| ControlPki::new(&dir));
        let relay = match (&pki, self.relay) {
            (Some(pki), true) => Some(Relay::start(pki).await),
            _ => None,
        };
        let control = pki.as_ref().map(|pki| {
            let mut files = pki.files.clone();
            if let Some(r) = &relay {
                files.extra = format!(
                    "plane = \"{}\"\nspool_dir = {:?}\nbatch_interval_ms = 50\n",
                    r.addr,
                    dir.join("spool").display().to_string()
                );
            }
            files
        });
        let config = TestConfig {
            sessions: self
                .session
                .into_iter()
                .map(|s| TestSession {
                    trust_file: trust.clone(),
                    ..s
                })
                .chain(self.more_sessions.into_iter().map(|s| TestSession {
                    trust_file: dir.join(format!("{}-ca.pem", s.id)),
                    ..s
                }))
                .collect(),
            answerer: self.answerer,
            secrets: self
                .secrets
                .iter()
                .map(|(name, file)| (name.clone(), dir.join(file)))
                .collect(),
            limits: self.limits,
            workers: self.workers.unwrap_or(base.workers),
            control,
            ..base
        };
        let gateway = G::start(&dir, &G::toml(&config, &dir));
        Single {
            gateway,
            relay,
            pki,
            peers,
            dir,
            trust,
            config,
            _tmp: tmp,
        }
    }
}

impl<G: Process, P> Single<G, P> {
    /// The config text the gateway was started with, with `limits` as its
    /// `[limits]` lines: what a test rewrites the file with to reload.
    pub fn config(&self, limits: &str) -> String {
        let config = TestConfig {
            limits: limits.to_owned(),
            ..self.config.clone()
        };
        G::toml(&config, &self.dir)
    }

    /// curl through the gateway from [`SESSION_SOURCE`], trusting the
    /// session's CA, to `https://{name}{path}` with `extra` options.
    pub fn curl(&self, name: &str, path: &str, extra: &[&str]) -> Curled {
        self.curl_to(name).args(extra).run(path)
    }

    /// curl through the gateway to `name`, trusting the session's CA, for
    /// a test to set more (another source, another bound).
    pub fn curl_to<'a>(&'a self, name: &'a str) -> Curl<'a> {
        Curl::via(self.gateway.data(), &self.trust, name)
    }

    /// An HTTP/1.1 or HTTP/2 connection to `name` through the gateway from
    /// [`SESSION_SOURCE`], trusting the session's CA.
    pub async fn connect(&self, name: &str, h2: bool) -> http::Sender {
        http::connect(SESSION_SOURCE, self.gateway.data(), name, &self.trust, h2).await
    }

    /// The TLS connection under [`Single::connect`]'s, for bytes written
    /// by hand.
    pub async fn tls(
        &self,
        name: &str,
        h2: bool,
    ) -> tokio_rustls::client::TlsStream<tokio::net::TcpStream> {
        http::tls(SESSION_SOURCE, self.gateway.data(), name, &self.trust, h2).await
    }

    /// The control CA (the rig was built with [`SingleBuilder::control`]).
    pub fn pki(&self) -> &ControlPki {
        self.pki.as_ref().expect("a rig with a control channel")
    }

    /// The relay (the rig was built with [`SingleBuilder::relay`]).
    pub fn relay(&self) -> &Relay {
        self.relay.as_ref().expect("a rig with a relay")
    }

    /// The relay, if the rig has one.
    pub fn relay_if_any(&self) -> Option<&Relay> {
        self.relay.as_ref()
    }

    /// A control client with the control plane's certificate.
    pub fn client(&self) -> pb::gateway_client::GatewayClient<Channel> {
        let pki = self.pki();
        gateway_client(
            self.gateway.control(),
            &pki.ca.cert_pem,
            Some(pki.client_identity()),
        )
    }

    /// `OpenSession` with `request`; the session's CA written to
    /// `dir/<file>`, its path.
    pub async fn open(&self, request: pb::OpenSessionRequest, file: &str) -> PathBuf {
        let opened = self
            .client()
            .open_session(request)
            .await
            .expect("open")
            .into_inner();
        let path = self.dir.join(file);
        std::fs::write(&path, opened.ca_pem).expect("write CA");
        path
    }

    /// The gateway's data listener.
    pub fn data(&self) -> SocketAddr {
        self.gateway.data()
    }

    /// Every record the gateway wrote so far (`dir/records.jsonl`; a
    /// [`crate::member::Member`]'s processes across its handovers write
    /// the same file).
    pub fn records(&self) -> Vec<serde_json::Value> {
        std::fs::read_to_string(records_path(&self.dir))
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).expect("a record is JSON"))
            .collect()
    }
}

impl<G: Process, P> Drop for Single<G, P> {
    /// A failing test shows what the gateway logged.
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("gateway log:\n{}", self.gateway.log());
        }
    }
}
