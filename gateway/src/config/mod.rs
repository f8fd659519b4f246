//! The gateway's configuration file (TOML).
//!
//! Every field, its unit and its default is documented in
//! `docs/configuration.md`; `ops/gateway.example.toml` is a complete example
//! that `gateway check-config` accepts. Loading is strict: an unknown field, a
//! bad value or two sessions claiming one source address stops start-up with
//! an error that names the field and the line at fault.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use ipnet::IpNet;
use serde::Deserialize;
use toml::Spanned;

use talos_contract::id::is_id;
use talos_contract::source::canonical_ip;
use talos_contract::spec::{
    AttachDraft, Fault, Field, ScopeDraft, SessionDraft, SessionSpec, SpecError,
};

use crate::gate::name::Name;

/// A config that failed to load, naming where and why.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    /// Syntax or type errors, on one line: the line (and column) the TOML
    /// library points at, the field that line sets (or the table it
    /// opens) when it sets one, and the library's message.
    #[error("{}", parse_text(path, *line, *column, field.as_deref(), message))]
    Parse {
        path: PathBuf,
        /// 1-based; none when the library points nowhere.
        line: Option<usize>,
        column: usize,
        field: Option<String>,
        message: String,
    },
    /// A value that parsed but breaks a rule of its own.
    #[error("{path}:{line}: {field}: {message}")]
    Invalid {
        path: PathBuf,
        line: usize,
        field: String,
        message: String,
    },
}

/// The whole configuration.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// This gateway's id, as records and the control plane name it.
    /// Required; 1–64 bytes of letters, digits, `-`, `_`, `.`.
    pub gateway_id: Spanned<String>,
    /// Listeners. Defaults: see [`Listen`].
    #[serde(default)]
    pub listen: Listen,
    /// Where connection records go.
    pub records: Records,
    /// How destination names are resolved.
    #[serde(default)]
    pub resolver: Resolver,
    /// How the gateway reaches destinations.
    #[serde(default)]
    pub upstream: Upstream,
    /// Bounds on what one client can make the gateway hold.
    #[serde(default)]
    pub limits: Limits,
    /// The threads that serve connections.
    #[serde(default)]
    pub runtime: Runtime,
    /// Sessions known from the file, for running without a control plane.
    #[serde(default, rename = "session")]
    pub sessions: Vec<StaticSession>,
    /// Where static sessions' secret values come from (never the values).
    #[serde(default, rename = "secret")]
    pub secrets: Vec<SecretSource>,
    /// The control channel. Optional: without it the gateway serves only
    /// the static sessions.
    #[serde(default)]
    pub control: Option<Control>,
    /// The process socket: reloads and upgrades.
    #[serde(default)]
    pub process: Process,
    /// What is logged.
    #[serde(default)]
    pub log: Log,
    /// The file's text, as read: its digest names the config loaded, and
    /// errors found after parsing (a reload's) point into it.
    #[serde(skip)]
    source: String,
}

/// The process socket (`[process]`).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Process {
    /// A Unix socket (made mode 0600; its directory should be the
    /// gateway user's alone) where `gateway reload` and `gateway upgrade`
    /// reach the running process, and where a successor takes over from
    /// it. Optional: without it SIGHUP still reloads, and upgrades cannot
    /// be made (SIGUSR2 says so).
    #[serde(default)]
    pub socket: Option<Spanned<PathBuf>>,
}

/// Logging (`[log]`).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Log {
    /// What is logged, as `RUST_LOG` directives (`info`,
    /// `warn,talos_gateway=debug`, …). Default `info`. `RUST_LOG`, when
    /// set, wins; a reload applies a changed level at once.
    #[serde(default)]
    pub level: Option<Spanned<String>>,
}

impl Log {
    /// The directives in force: the config's, or `info`.
    pub fn directives(&self) -> &str {
        self.level.as_ref().map_or("info", |l| l.get_ref().as_str())
    }
}

/// The control channel (`[control]`): the `Gateway` gRPC service over
/// mutually authenticated TLS 1.3. Every field is required.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Control {
    /// Where the control plane connects, `ADDR:PORT`.
    pub listen: Spanned<SocketAddr>,
    /// PEM file of the control CA: a client must present a certificate
    /// chaining to it.
    pub ca_file: Spanned<PathBuf>,
    /// PEM file of the gateway's control-channel certificate chain.
    pub cert_file: Spanned<PathBuf>,
    /// PEM file of that certificate's private key; group and others must
    /// have no access to it.
    pub key_file: Spanned<PathBuf>,
    /// The gateway's Ed25519 key that signs batches and drop reports
    /// (PKCS#8 DER); made, mode 0600, if missing.
    pub signing_key_file: Spanned<PathBuf>,
    /// The control plane's `ControlPlane` service, `ADDR:PORT`, where the
    /// gateway ships its signed batches of records. Without it no batch is
    /// made: records go only to `[records] path`.
    #[serde(default)]
    pub plane: Option<Spanned<SocketAddr>>,
    /// The DNS name the control plane's certificate must carry. Default
    /// `control-stub` (the name `control-stub init` gives it).
    #[serde(default = "Control::default_plane_name")]
    pub plane_name: String,
    /// Where sealed batches wait until the control plane acknowledges them
    /// (a directory, made mode 0700). Required with `plane`.
    #[serde(default)]
    pub spool_dir: Option<Spanned<PathBuf>>,
    /// The most records in one batch. Default 1000; range 1-10000.
    #[serde(default = "Control::default_batch_max_records")]
    pub batch_max_records: usize,
    /// The longest a record waits before its batch is sealed, in
    /// milliseconds. Default 1000; range 10-60000.
    #[serde(default = "Control::default_batch_interval_ms")]
    pub batch_interval_ms: u64,
    /// The most batches the spool holds unacknowledged. At the bound the
    /// gateway fails closed: it stops accepting new connections until the
    /// control plane acknowledges batches again. Default 1000; range
    /// 1-1000 (the control plane tells a re-sent batch from a forged one
    /// by the last 1,024 digests it accepted).
    #[serde(default = "Control::default_spool_max_batches")]
    pub spool_max_batches: usize,
    /// The most bytes the spool holds; the same fail-closed rule. Default
    /// 1 GiB; at least 1 MiB.
    #[serde(default = "Control::default_spool_max_bytes")]
    pub spool_max_bytes: u64,
    /// The lease of every authority the control plane opens, in
    /// milliseconds: an authority whose lease nobody renews within this
    /// time is dropped (reason `lease_expired`). Default 60000 (one
    /// minute); range 1000-3600000. Shorter ends the authority of a member
    /// cut off from the control plane sooner; longer rides out a longer
    /// control-plane outage (docs/operators.md, "Leases").
    #[serde(default = "Control::default_lease_ms")]
    pub lease_ms: u64,
}

impl Control {
    fn default_plane_name() -> String {
        "control-stub".into()
    }
    fn default_batch_max_records() -> usize {
        1000
    }
    fn default_lease_ms() -> u64 {
        60_000
    }

    /// [`Control::lease_ms`] as a duration.
    pub fn lease(&self) -> std::time::Duration {
        std::time::Duration::from_millis(self.lease_ms)
    }
    fn default_batch_interval_ms() -> u64 {
        1000
    }
    fn default_spool_max_batches() -> usize {
        1000
    }
    fn default_spool_max_bytes() -> u64 {
        1 << 30
    }
}

/// Where one secret's value is read from at start-up (`[[secret]]`):
/// exactly one of `env` and `file`. The value itself is never in the file.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SecretSource {
    /// The secret's name, as attachments name it. Required, unique.
    pub name: Spanned<String>,
    /// An environment variable holding the value.
    #[serde(default)]
    pub env: Option<String>,
    /// A file holding the value (one trailing newline is not part of it).
    #[serde(default)]
    pub file: Option<PathBuf>,
}

/// Listening addresses.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Listen {
    /// Where session traffic arrives (nftables redirects every port-443
    /// connection here). Default `0.0.0.0:443`.
    #[serde(default = "Listen::default_data")]
    pub data: SocketAddr,
    /// Metrics (`/metrics`) and health (`/healthz`, `/readyz`), plain HTTP.
    /// Default `127.0.0.1:9443`. Keep it off the session network.
    #[serde(default = "Listen::default_admin")]
    pub admin: SocketAddr,
}

impl Listen {
    fn default_data() -> SocketAddr {
        SocketAddr::from(([0, 0, 0, 0], 443))
    }
    fn default_admin() -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], 9443))
    }
}

impl Default for Listen {
    fn default() -> Self {
        Listen {
            data: Listen::default_data(),
            admin: Listen::default_admin(),
        }
    }
}

/// The record sink.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Records {
    /// A file that receives one JSON object per line, per connection; opened
    /// for append, created if missing. Required.
    pub path: PathBuf,
}

/// Name resolution.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Resolver {
    /// Nameservers as `ADDRESS:PORT` (UDP, falling back to TCP for truncated
    /// answers). Empty (the default): the system's `/etc/resolv.conf`.
    #[serde(default)]
    pub nameservers: Vec<Spanned<SocketAddr>>,
    /// How long one query may take, in milliseconds. Default 2000.
    #[serde(default = "Resolver::default_timeout_ms")]
    pub timeout_ms: u64,
    /// How many times a query is sent before the name counts as
    /// unresolvable. Default 2.
    #[serde(default = "Resolver::default_attempts")]
    pub attempts: usize,
    /// Address blocks that are NOT refused `resolves_internal` although
    /// internal. Default empty. Only for labs and tests whose origins live on
    /// loopback; `check-config` and start-up warn when it is set.
    #[serde(default)]
    pub permit_internal: Vec<Spanned<IpNet>>,
}

impl Resolver {
    fn default_timeout_ms() -> u64 {
        2000
    }
    fn default_attempts() -> usize {
        2
    }
    /// The per-query timeout.
    /// The resolver's settings, as [`crate::gate::resolve::Resolver::new`] takes them.
    pub fn settings(&self) -> crate::gate::resolve::Settings {
        crate::gate::resolve::Settings {
            nameservers: self.nameservers.iter().map(|n| *n.get_ref()).collect(),
            timeout: self.timeout(),
            attempts: self.attempts,
            permit_internal: self.permit_internal.iter().map(|n| *n.get_ref()).collect(),
        }
    }

    pub fn timeout(&self) -> Duration {
        Duration::from_millis(self.timeout_ms)
    }
}

impl Default for Resolver {
    fn default() -> Self {
        Resolver {
            nameservers: Vec::new(),
            timeout_ms: Resolver::default_timeout_ms(),
            attempts: Resolver::default_attempts(),
            permit_internal: Vec::new(),
        }
    }
}

/// Reaching destinations.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Upstream {
    /// The destination port. Default 443: the gateway passes port 443 only;
    /// tests point it at a loopback origin's port.
    #[serde(default = "Upstream::default_port")]
    pub port: u16,
    /// How long a TCP connect to one resolved address may take, in
    /// milliseconds. Default 5000.
    #[serde(default = "Upstream::default_connect_timeout_ms")]
    pub connect_timeout_ms: u64,
    /// PEM files of CA certificates trusted for destinations IN ADDITION to
    /// the public roots (webpki-roots). Default empty. Only for labs and
    /// tests whose origins have their own test CA; start-up warns.
    #[serde(default)]
    pub extra_trust_anchors: Vec<Spanned<PathBuf>>,
}

impl Upstream {
    fn default_port() -> u16 {
        443
    }
    fn default_connect_timeout_ms() -> u64 {
        5000
    }
    /// The connect timeout.
    pub fn connect_timeout(&self) -> Duration {
        Duration::from_millis(self.connect_timeout_ms)
    }
}

impl Default for Upstream {
    fn default() -> Self {
        Upstream {
            port: Upstream::default_port(),
            connect_timeout_ms: Upstream::default_connect_timeout_ms(),
            extra_trust_anchors: Vec::new(),
        }
    }
}

/// Bounds on what clients can make the gateway hold.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Limits {
    /// The most bytes read while waiting for a complete ClientHello, record
    /// headers included. Default 16640 (one full 16 KiB TLS record plus
    /// headers): real hellos, post-quantum key shares included, are under 2 KiB.
    /// Range 512–65536.
    #[serde(default = "Limits::default_hello_max_bytes")]
    pub hello_max_bytes: usize,
    /// How long a client has to send its whole ClientHello, in milliseconds.
    /// Default 5000. Slower senders are cut off (`not_tls`).
    #[serde(default = "Limits::default_hello_timeout_ms")]
    pub hello_timeout_ms: u64,
    /// How long the TLS handshake with the session may take once the hello
    /// is read, in milliseconds. Default 10000.
    #[serde(default = "Limits::default_handshake_timeout_ms")]
    pub handshake_timeout_ms: u64,
    /// The most client connections open at once; past it the gateway stops
    /// accepting until one closes (the kernel's backlog holds the rest).
    /// Default 20000.
    #[serde(default = "Limits::default_max_connections")]
    pub max_connections: usize,
    /// On SIGTERM/SIGINT, how long open connections may finish, in
    /// milliseconds, before they are cut. Default 10000.
    #[serde(default = "Limits::default_shutdown_grace_ms")]
    pub shutdown_grace_ms: u64,
    /// How long an HTTP/2 session connection may answer nothing before it
    /// is closed (gracefully: GOAWAY), in milliseconds. Default 60000, as
    /// an idle HTTP/1.1 connection waits for its next request.
    #[serde(default = "Limits::default_h2_idle_timeout_ms")]
    pub h2_idle_timeout_ms: u64,
    /// How long a session connection may be silent before TCP keep-alive
    /// probes it, in milliseconds; a peer that answers none of three probes
    /// (a third of this apart) is cut. Default 30000.
    #[serde(default = "Limits::default_tcp_keepalive_ms")]
    pub tcp_keepalive_ms: u64,
    /// Per session: connections open at once. Default 256.
    #[serde(default = "Limits::default_session_connections")]
    pub session_connections: u32,
    /// Per session: connections in the hello or the TLS handshake at once.
    /// Default 64.
    #[serde(default = "Limits::default_session_handshakes")]
    pub session_handshakes: u32,
    /// Per session: requests held for approval at once. Default 32.
    #[serde(default = "Limits::default_session_held_requests")]
    pub session_held_requests: u32,
    /// Per session: agent proposals waiting for a decision at once.
    /// Default 8.
    #[serde(default = "Limits::default_session_pending_proposals")]
    pub session_pending_proposals: u32,
    /// Per session: proposals (held requests' and agents') per minute, on
    /// average. Default 30.
    #[serde(default = "Limits::default_session_proposals_per_minute")]
    pub session_proposals_per_minute: u32,
    /// Per session: proposals that may come at once before the rate
    /// applies. Default 10.
    #[serde(default = "Limits::default_session_proposal_burst")]
    pub session_proposal_burst: u32,
    /// Per reply: the most bytes a coded reply may decode to. Default
    /// 1073741824 (1 GiB).
    #[serde(default = "Limits::default_reply_decoded_max_bytes")]
    pub reply_decoded_max_bytes: u64,
    /// Per reply: the most decoded bytes per coded byte, once past 1 MiB.
    /// Default 100.
    #[serde(default = "Limits::default_reply_decoded_max_ratio")]
    pub reply_decoded_max_ratio: u64,
}

impl Limits {
    fn default_hello_max_bytes() -> usize {
        16_384 + 256
    }
    fn default_hello_timeout_ms() -> u64 {
        5000
    }
    fn default_handshake_timeout_ms() -> u64 {
        10_000
    }
    fn default_max_connections() -> usize {
        20_000
    }
    fn default_shutdown_grace_ms() -> u64 {
        10_000
    }
    fn default_h2_idle_timeout_ms() -> u64 {
        60_000
    }
    fn default_tcp_keepalive_ms() -> u64 {
        30_000
    }
    fn default_session_connections() -> u32 {
        crate::session::share::Limits::default().connections
    }
    fn default_session_handshakes() -> u32 {
        crate::session::share::Limits::default().handshakes
    }
    fn default_session_held_requests() -> u32 {
        crate::session::share::Limits::default().held_requests
    }
    fn default_session_pending_proposals() -> u32 {
        crate::session::share::Limits::default().pending_proposals
    }
    fn default_session_proposals_per_minute() -> u32 {
        crate::session::share::Limits::default().proposals_per_minute
    }
    fn default_session_proposal_burst() -> u32 {
        crate::session::share::Limits::default().proposal_burst
    }
    fn default_reply_decoded_max_bytes() -> u64 {
        crate::secrets::decode::Bounds::default().max_bytes
    }
    fn default_reply_decoded_max_ratio() -> u64 {
        crate::secrets::decode::Bounds::default().max_ratio
    }
    /// The HTTP/2 idle timeout.
    pub fn h2_idle_timeout(&self) -> Duration {
        Duration::from_millis(self.h2_idle_timeout_ms)
    }
    /// The TCP keep-alive idle time.
    pub fn tcp_keepalive(&self) -> Duration {
        Duration::from_millis(self.tcp_keepalive_ms)
    }
    /// Every session's share.
    pub fn share(&self) -> crate::session::share::Limits {
        crate::session::share::Limits {
            connections: self.session_connections,
            handshakes: self.session_handshakes,
            held_requests: self.session_held_requests,
            pending_proposals: self.session_pending_proposals,
            proposals_per_minute: self.session_proposals_per_minute,
            proposal_burst: self.session_proposal_burst,
            decode: crate::secrets::decode::Bounds {
                max_bytes: self.reply_decoded_max_bytes,
                max_ratio: self.reply_decoded_max_ratio,
            },
        }
    }
    /// The hello deadline.
    pub fn hello_timeout(&self) -> Duration {
        Duration::from_millis(self.hello_timeout_ms)
    }
    /// The session-side TLS handshake deadline.
    pub fn handshake_timeout(&self) -> Duration {
        Duration::from_millis(self.handshake_timeout_ms)
    }
    /// The drain grace.
    pub fn shutdown_grace(&self) -> Duration {
        Duration::from_millis(self.shutdown_grace_ms)
    }
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            hello_max_bytes: Limits::default_hello_max_bytes(),
            hello_timeout_ms: Limits::default_hello_timeout_ms(),
            handshake_timeout_ms: Limits::default_handshake_timeout_ms(),
            max_connections: Limits::default_max_connections(),
            shutdown_grace_ms: Limits::default_shutdown_grace_ms(),
            h2_idle_timeout_ms: Limits::default_h2_idle_timeout_ms(),
            tcp_keepalive_ms: Limits::default_tcp_keepalive_ms(),
            session_connections: Limits::default_session_connections(),
            session_handshakes: Limits::default_session_handshakes(),
            session_held_requests: Limits::default_session_held_requests(),
            session_pending_proposals: Limits::default_session_pending_proposals(),
            session_proposals_per_minute: Limits::default_session_proposals_per_minute(),
            session_proposal_burst: Limits::default_session_proposal_burst(),
            reply_decoded_max_bytes: Limits::default_reply_decoded_max_bytes(),
            reply_decoded_max_ratio: Limits::default_reply_decoded_max_ratio(),
        }
    }
}

/// The threads that serve connections (`[runtime]`).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Runtime {
    /// How many threads serve connections (1–1024). Default: one per CPU
    /// the process may run on. With 1, that one thread runs every
    /// connection and the accept loop on a single-threaded scheduler, which
    /// costs less per request than a pool of one; with more, connections
    /// are spread over a work-stealing pool of that many threads. Blocking
    /// file writes (records, the spool) run on extra threads either way.
    pub workers: Option<Spanned<usize>>,
}

impl Runtime {
    /// The most `workers` may be.
    pub const MAX_WORKERS: usize = 1024;

    /// The number of threads serving connections: `workers`, or one per
    /// CPU the process may run on (1 if that cannot be read).
    pub fn workers(&self) -> usize {
        match &self.workers {
            Some(n) => *n.get_ref(),
            None => std::thread::available_parallelism().map_or(1, |n| n.get()),
        }
    }
}

/// A session defined in the file (`[[session]]`).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StaticSession {
    /// The session id. Required, unique.
    pub id: Spanned<String>,
    /// The tenant (customer) the session serves. Required.
    pub tenant: String,
    /// The attempt number (1 at start, +1 at each resume). Default 1.
    #[serde(default = "StaticSession::default_attempt")]
    pub attempt: u32,
    /// The session's source addresses: a connection from one of them belongs
    /// to this session. Required, at least one; no address in two sessions.
    pub sources: Spanned<Vec<Spanned<IpAddr>>>,
    /// The destination names the session may reach, exactly (no wildcards;
    /// canonicalised: lower case, no trailing dot). Default empty.
    #[serde(default)]
    pub allowlist: Vec<Spanned<Name>>,
    /// Where the gateway writes the session CA's certificate (PEM) at
    /// start-up: the file the session's instance installs as its only
    /// trust anchor. Optional; the digest is logged either way.
    #[serde(default)]
    pub trust_file: Option<PathBuf>,
    /// Credentials attached by name: `SECRET=destination:header[:scheme]`,
    /// as the CLI's `--attach`. The destination must be on the allowlist and
    /// the secret defined in a `[[secret]]` table. Default empty.
    #[serde(default)]
    pub attach: Vec<Spanned<String>>,
}

impl StaticSession {
    fn default_attempt() -> u32 {
        1
    }

    /// The session as a draft of the contract's spec (no Lock, no relay:
    /// static sessions have no control plane).
    pub fn draft(&self) -> SessionDraft<'_> {
        SessionDraft {
            id: self.id.get_ref(),
            tenant: &self.tenant,
            attempt: self.attempt,
            scope: ScopeDraft {
                sources: self
                    .sources
                    .get_ref()
                    .iter()
                    .map(|s| s.get_ref().to_string())
                    .collect(),
                allowlist: self
                    .allowlist
                    .iter()
                    .map(|n| n.get_ref().as_str())
                    .collect(),
                attachments: self
                    .attach
                    .iter()
                    .map(|a| AttachDraft::Text(a.get_ref()))
                    .collect(),
            },
            ..SessionDraft::default()
        }
    }

    /// The session's spec, checked by the contract's rules.
    pub fn spec(&self) -> Result<SessionSpec, SpecError> {
        SessionSpec::new(&self.draft())
    }

    /// Where a refusal points in the file, the field under `session[i]`,
    /// and the message, as this file's errors say it.
    fn refusal(&self, e: &SpecError) -> (std::ops::Range<usize>, String, String) {
        let sid = self.id.get_ref();
        let fault = e.fault.to_string();
        match e.field {
            Field::Id => (
                self.id.span(),
                "id".into(),
                format!("{sid:?} must be 1-64 letters, digits, '-', '_' or '.'"),
            ),
            Field::Attempt => (self.id.span(), "attempt".into(), fault),
            Field::Tenant => (self.id.span(), "tenant".into(), fault),
            Field::Sources => (
                self.sources.span(),
                "sources".into(),
                "a session needs at least one source address".into(),
            ),
            Field::Source(j) => (
                self.sources.get_ref()[j].span(),
                format!("sources[{j}]"),
                fault,
            ),
            Field::Allowlist(j) => {
                let name = &self.allowlist[j];
                let message = match &e.fault {
                    Fault::Repeated => format!("{} is listed twice", name.get_ref()),
                    Fault::Name(n) => n.to_string(),
                    _ => fault,
                };
                (name.span(), format!("allowlist[{j}]"), message)
            }
            Field::Attachment(j, _) => {
                let text = &self.attach[j];
                let message = match &e.fault {
                    Fault::Attach(a) => format!(
                        "attachment {:?}: {a}",
                        text.get_ref().chars().take(200).collect::<String>()
                    ),
                    Fault::NotAllowed { destination } => {
                        format!("{destination} is not on the session's allowlist")
                    }
                    Fault::TargetTaken {
                        destination,
                        header,
                        earlier,
                    } => format!(
                        "{destination} already carries secret {earlier} in {header}: one attachment per destination and header"
                    ),
                    _ => fault,
                };
                (text.span(), format!("attach[{j}]"), message)
            }
            Field::Lock | Field::Rule(..) | Field::RelayKey => {
                (self.id.span(), e.field.to_string(), fault)
            }
        }
    }
}

impl StaticSession {
    /// The spec of a session from the config file, with secret values
    /// looked up by name in `values`.
    pub fn session_spec(
        &self,
        values: &HashMap<String, crate::secrets::secret::SecretBytes>,
    ) -> Result<crate::session::sessions::SessionSpec, crate::secrets::secret::SecretError> {
        use crate::secrets::secret::{Attachment, SecretError};
        let s = self;
        // The config was checked when it loaded; this is the same check.
        let spec = s.spec().map_err(|e| SecretError::BadAttachment {
            spec: s.id.get_ref().clone(),
            reason: e.to_string(),
        })?;
        let mut attachments = Vec::new();
        for a in spec.scope().attachments() {
            let value =
                values
                    .get(a.secret())
                    .cloned()
                    .ok_or_else(|| SecretError::BadAttachment {
                        spec: a.secret().to_owned(),
                        reason: "no such secret".into(),
                    })?;
            attachments.push(Attachment::new(a, value)?);
        }
        Ok(crate::session::sessions::SessionSpec {
            id: spec.id().to_owned(),
            tenant: spec.tenant().to_owned(),
            attempt: spec.attempt(),
            allowlist: spec.scope().allowlist().to_vec(),
            attachments,
            // Static sessions have no control plane, so no Lock.
            lock: Vec::new(),
            relay_key: None,
        })
    }
}

/// Warnings that do not stop start-up but that an operator must see.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Warning(pub String);

impl Config {
    /// Read, parse and validate a config file.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_owned(),
            source,
        })?;
        Config::parse(path, &text)
    }

    /// Parse and validate config text; `path` only names it in errors.
    pub fn parse(path: &Path, text: &str) -> Result<Config, ConfigError> {
        let mut config: Config = toml::from_str(text).map_err(|e| parse_error(path, text, &e))?;
        config.validate(path, text)?;
        config.source = text.to_owned();
        Ok(config)
    }

    /// The `[process] socket` a config file names, read leniently: the
    /// rest of the file may be wrong, even its syntax (`gateway reload`
    /// asks the running process, which reads the file itself and says
    /// what is wrong with it). A file TOML cannot read is searched line by
    /// line: the `socket` key of the `[process]` table (or a top-level
    /// `process.socket` or `process = { socket = … }`), each such line
    /// read as TOML on its own.
    pub fn process_socket(path: &Path) -> Result<Option<PathBuf>, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_owned(),
            source,
        })?;
        let socket = |table: &toml::Table| {
            table
                .get("process")
                .and_then(|p| p.get("socket"))
                .and_then(toml::Value::as_str)
                .map(PathBuf::from)
        };
        if let Ok(table) = toml::from_str::<toml::Table>(&text) {
            return Ok(socket(&table));
        }
        let mut current = String::new();
        for line in text.lines() {
            if let Some((name, _)) = table_header(line) {
                current = name.to_owned();
                continue;
            }
            let key = line.trim_start();
            let candidate = match current.as_str() {
                "process" if key.starts_with("socket") => format!("[process]\n{line}"),
                "" if key.starts_with("process") => line.to_owned(),
                _ => continue,
            };
            if let Some(found) = toml::from_str::<toml::Table>(&candidate)
                .ok()
                .as_ref()
                .and_then(socket)
            {
                return Ok(Some(found));
            }
        }
        Ok(None)
    }

    /// The static sessions' secret values, read from their sources (the
    /// validation guarantees exactly one source each); an error names the
    /// secret, never the value.
    pub fn secret_values(
        &self,
    ) -> Result<
        HashMap<String, crate::secrets::secret::SecretBytes>,
        crate::secrets::secret::SecretError,
    > {
        use crate::secrets::secret::{from_env, from_file, SecretError};
        let mut values = HashMap::new();
        for src in &self.secrets {
            let name = src.name.get_ref();
            let value = match (&src.env, &src.file) {
                (Some(var), _) => from_env(name, var),
                (None, Some(path)) => from_file(name, path),
                (None, None) => Err(SecretError::Empty { name: name.clone() }),
            }?;
            values.insert(name.clone(), value);
        }
        Ok(values)
    }

    /// The SHA-384 (hex) of the file's text: which config is loaded.
    pub fn digest(&self) -> String {
        talos_certs::sha384_hex(self.source.as_bytes())
    }

    /// The fields only a restart changes, each with its value as text (see
    /// `docs/operators.md`, "Reload"): listen addresses, the gateway's id,
    /// the control identity and channel, the record file, the spool and
    /// its batches, the threads, the process socket.
    pub fn restart_only(&self) -> Vec<(&'static str, String)> {
        let mut fields = vec![
            ("gateway_id", self.gateway_id.get_ref().clone()),
            ("listen.data", self.listen.data.to_string()),
            ("listen.admin", self.listen.admin.to_string()),
            ("records.path", self.records.path.display().to_string()),
            (
                "runtime.workers",
                format!("{:?}", self.runtime.workers.as_ref().map(|w| *w.get_ref())),
            ),
            (
                "process.socket",
                format!("{:?}", self.process.socket.as_ref().map(|s| s.get_ref())),
            ),
        ];
        match &self.control {
            None => fields.push(("control", "none".into())),
            Some(c) => fields.extend([
                ("control.listen", c.listen.get_ref().to_string()),
                ("control.ca_file", c.ca_file.get_ref().display().to_string()),
                (
                    "control.cert_file",
                    c.cert_file.get_ref().display().to_string(),
                ),
                (
                    "control.key_file",
                    c.key_file.get_ref().display().to_string(),
                ),
                (
                    "control.signing_key_file",
                    c.signing_key_file.get_ref().display().to_string(),
                ),
                (
                    "control.plane",
                    format!("{:?}", c.plane.as_ref().map(|p| *p.get_ref())),
                ),
                ("control.plane_name", c.plane_name.clone()),
                (
                    "control.spool_dir",
                    format!("{:?}", c.spool_dir.as_ref().map(|d| d.get_ref())),
                ),
                ("control.batch_max_records", c.batch_max_records.to_string()),
                ("control.batch_interval_ms", c.batch_interval_ms.to_string()),
                ("control.spool_max_batches", c.spool_max_batches.to_string()),
                ("control.spool_max_bytes", c.spool_max_bytes.to_string()),
            ]),
        }
        fields
    }

    /// The first field only a restart changes whose value differs between
    /// `running` (its fields as [`Config::restart_only`] gave them) and this
    /// config, as an error naming its line in this file.
    pub fn check_restart_only(
        &self,
        path: &Path,
        running: &[(&'static str, String)],
    ) -> Result<(), ConfigError> {
        let mine = self.restart_only();
        for (field, was) in running {
            // `control` (the whole table) is reported under its own name.
            if mine.iter().find(|(f, _)| f == field).map(|(_, v)| v) != Some(was) {
                return Err(self.changed_field(path, field, was));
            }
        }
        if let Some((field, _)) = mine
            .iter()
            .find(|(f, _)| !running.iter().any(|(r, _)| r == f))
        {
            return Err(self.changed_field(path, field, "none"));
        }
        Ok(())
    }

    /// `field`, one only a restart changes, is `was` in the running
    /// process and otherwise here: the error a reload or a successor
    /// refuses this config with, naming the field's line.
    pub fn changed_field(&self, path: &Path, field: &str, was: &str) -> ConfigError {
        let mine = self.restart_only();
        let now = mine
            .iter()
            .find(|(f, _)| *f == field)
            .map_or("none", |(_, v)| v.as_str());
        self.field_error(
            path,
            field,
            format!(
                "changes only with a restart: a reload or an upgrade keeps it as running (running: {was}; here: {now})"
            ),
        )
    }

    /// An error about `field` (dotted: `control.signing_key_file`) of this
    /// config, naming the line that sets it (or its table's header).
    pub fn field_error(&self, path: &Path, field: &str, message: String) -> ConfigError {
        ConfigError::Invalid {
            path: path.to_owned(),
            line: line_of(&self.source, find_field(&self.source, field).start),
            field: field.to_owned(),
            message,
        }
    }

    fn validate(&self, path: &Path, text: &str) -> Result<(), ConfigError> {
        let invalid =
            |span: std::ops::Range<usize>, field: &str, message: String| ConfigError::Invalid {
                path: path.to_owned(),
                line: line_of(text, span.start),
                field: field.to_owned(),
                message,
            };
        let id = self.gateway_id.get_ref();
        if !is_id(id) {
            return Err(invalid(
                self.gateway_id.span(),
                "gateway_id",
                format!("{id:?} must be 1-64 letters, digits, '-', '_' or '.'"),
            ));
        }
        if let Some(level) = &self.log.level {
            if let Err(e) = tracing_subscriber::EnvFilter::builder().parse(level.get_ref()) {
                return Err(invalid(
                    level.span(),
                    "log.level",
                    format!("{:?} is not a log filter: {e}", level.get_ref()),
                ));
            }
        }
        if let Some(socket) = &self.process.socket {
            let p = socket.get_ref();
            if !p.is_absolute() {
                return Err(invalid(
                    socket.span(),
                    "process.socket",
                    format!("{} must be an absolute path", p.display()),
                ));
            }
            // sun_path holds 107 bytes and a NUL.
            if p.as_os_str().len() > 107 {
                return Err(invalid(
                    socket.span(),
                    "process.socket",
                    format!(
                        "{} is longer than a Unix socket path may be (107 bytes)",
                        p.display()
                    ),
                ));
            }
        }
        let l = &self.limits;
        if !(512..=65_536).contains(&l.hello_max_bytes) {
            return Err(invalid(
                find_key(text, "hello_max_bytes"),
                "limits.hello_max_bytes",
                format!("{} is outside 512-65536 bytes", l.hello_max_bytes),
            ));
        }
        for (value, field) in [
            (l.hello_timeout_ms, "limits.hello_timeout_ms"),
            (l.handshake_timeout_ms, "limits.handshake_timeout_ms"),
            (l.h2_idle_timeout_ms, "limits.h2_idle_timeout_ms"),
            (self.resolver.timeout_ms, "resolver.timeout_ms"),
            (
                self.upstream.connect_timeout_ms,
                "upstream.connect_timeout_ms",
            ),
        ] {
            if !(1..=600_000).contains(&value) {
                let key = field.rsplit('.').next().unwrap_or(field);
                return Err(invalid(
                    find_key(text, key),
                    field,
                    format!("{value} ms is outside 1-600000 ms"),
                ));
            }
        }
        if l.max_connections == 0 {
            return Err(invalid(
                find_key(text, "max_connections"),
                "limits.max_connections",
                "must be at least 1".into(),
            ));
        }
        for (value, key) in [
            (l.session_connections, "session_connections"),
            (l.session_handshakes, "session_handshakes"),
            (l.session_held_requests, "session_held_requests"),
            (l.session_pending_proposals, "session_pending_proposals"),
            (
                l.session_proposals_per_minute,
                "session_proposals_per_minute",
            ),
            (l.session_proposal_burst, "session_proposal_burst"),
        ] {
            if value == 0 {
                return Err(invalid(
                    find_key(text, key),
                    &format!("limits.{key}"),
                    "must be at least 1 (0 would refuse everything it bounds)".into(),
                ));
            }
        }
        if !(3_000..=600_000).contains(&l.tcp_keepalive_ms) {
            return Err(invalid(
                find_key(text, "tcp_keepalive_ms"),
                "limits.tcp_keepalive_ms",
                format!(
                    "{} ms is outside 3000-600000 ms (probes go a third of it apart, at least 1 s)",
                    l.tcp_keepalive_ms
                ),
            ));
        }
        if l.session_handshakes > l.session_connections {
            // The field at fault is the one the file sets: the handshakes'
            // bound when set, or else the connections' bound, set below
            // the handshakes' default.
            let why = "connections in their handshake are open connections";
            return Err(match find_set(text, "limits.session_handshakes") {
                Some(line) => invalid(
                    line,
                    "limits.session_handshakes",
                    format!(
                        "{} is more than limits.session_connections ({}): {why}",
                        l.session_handshakes, l.session_connections
                    ),
                ),
                None => invalid(
                    find_field(text, "limits.session_connections"),
                    "limits.session_connections",
                    format!(
                        "{} is less than limits.session_handshakes ({}, its default): {why}",
                        l.session_connections, l.session_handshakes
                    ),
                ),
            });
        }
        if l.reply_decoded_max_bytes < 1024 * 1024 {
            return Err(invalid(
                find_key(text, "reply_decoded_max_bytes"),
                "limits.reply_decoded_max_bytes",
                format!("{} is less than 1 MiB (1048576)", l.reply_decoded_max_bytes),
            ));
        }
        if !(2..=100_000).contains(&l.reply_decoded_max_ratio) {
            return Err(invalid(
                find_key(text, "reply_decoded_max_ratio"),
                "limits.reply_decoded_max_ratio",
                format!("{} is outside 2-100000", l.reply_decoded_max_ratio),
            ));
        }
        if let Some(n) = &self.runtime.workers {
            if !(1..=Runtime::MAX_WORKERS).contains(n.get_ref()) {
                return Err(invalid(
                    n.span(),
                    "runtime.workers",
                    format!("{} is outside 1-{}", n.get_ref(), Runtime::MAX_WORKERS),
                ));
            }
        }
        if !(1..=10).contains(&self.resolver.attempts) {
            return Err(invalid(
                find_key(text, "attempts"),
                "resolver.attempts",
                format!("{} is outside 1-10", self.resolver.attempts),
            ));
        }
        if self.upstream.port == 0 {
            return Err(invalid(
                find_key(text, "port"),
                "upstream.port",
                "port 0 cannot be connected to".into(),
            ));
        }

        for (i, anchor) in self.upstream.extra_trust_anchors.iter().enumerate() {
            if let Err(message) = read_pem_certs(anchor.get_ref()) {
                return Err(invalid(
                    anchor.span(),
                    &format!("upstream.extra_trust_anchors[{i}]"),
                    message,
                ));
            }
        }

        if let Some(c) = &self.control {
            for (file, field) in [
                (&c.ca_file, "control.ca_file"),
                (&c.cert_file, "control.cert_file"),
            ] {
                if let Err(message) = read_pem_certs(file.get_ref()) {
                    return Err(invalid(file.span(), field, message));
                }
            }
            if let Err(message) = read_private_key(c.key_file.get_ref()) {
                return Err(invalid(c.key_file.span(), "control.key_file", message));
            }
            if let Err(message) = check_private_file(c.signing_key_file.get_ref()) {
                return Err(invalid(
                    c.signing_key_file.span(),
                    "control.signing_key_file",
                    message,
                ));
            }
            match (&c.plane, &c.spool_dir) {
                (Some(plane), None) => {
                    return Err(invalid(
                        plane.span(),
                        "control.spool_dir",
                        "required with control.plane: batches wait there until acknowledged".into(),
                    ))
                }
                (None, Some(dir)) => {
                    return Err(invalid(
                        dir.span(),
                        "control.spool_dir",
                        "needs control.plane: without a control plane no batch is made".into(),
                    ))
                }
                _ => {}
            }
            if rustls::pki_types::DnsName::try_from(c.plane_name.as_str()).is_err() {
                return Err(invalid(
                    find_key(text, "plane_name"),
                    "control.plane_name",
                    format!("{:?} is not a DNS name", c.plane_name),
                ));
            }
            for (value, range, field) in [
                (c.batch_max_records as u64, 1..=10_000, "batch_max_records"),
                (c.batch_interval_ms, 10..=60_000, "batch_interval_ms"),
                (c.spool_max_batches as u64, 1..=1000, "spool_max_batches"),
                (c.spool_max_bytes, 1 << 20..=u64::MAX, "spool_max_bytes"),
                (c.lease_ms, 1000..=3_600_000, "lease_ms"),
            ] {
                if !range.contains(&value) {
                    return Err(invalid(
                        find_key(text, field),
                        &format!("control.{field}"),
                        format!("{value} is outside {}-{}", range.start(), range.end()),
                    ));
                }
            }
        }

        let mut secret_names: HashMap<&str, ()> = HashMap::new();
        for (i, src) in self.secrets.iter().enumerate() {
            let field = format!("secret[{i}]");
            let name = src.name.get_ref();
            if secret_names.insert(name, ()).is_some() {
                return Err(invalid(
                    src.name.span(),
                    &field,
                    format!("secret {name} is defined twice"),
                ));
            }
            if src.env.is_some() == src.file.is_some() {
                return Err(invalid(
                    src.name.span(),
                    &field,
                    format!("secret {name} needs exactly one of env and file (values never go in the config)"),
                ));
            }
        }

        let mut ids: HashMap<&str, ()> = HashMap::new();
        let mut owners: HashMap<IpAddr, &str> = HashMap::new();
        for (i, s) in self.sessions.iter().enumerate() {
            let sid = s.id.get_ref();
            let field = |f: &str| format!("session[{i}].{f}");
            let spec = s.spec().map_err(|e| {
                let (span, name, message) = s.refusal(&e);
                invalid(span, &field(&name), message)
            })?;
            if ids.insert(sid, ()).is_some() {
                return Err(invalid(
                    s.id.span(),
                    &field("id"),
                    format!("session id {sid:?} is used twice"),
                ));
            }
            for (j, src) in s.sources.get_ref().iter().enumerate() {
                let ip = canonical_ip(*src.get_ref());
                if let Some(other) = owners.insert(ip, sid) {
                    return Err(invalid(
                        src.span(),
                        &field(&format!("sources[{j}]")),
                        format!("{ip} is already a source of session {other:?}"),
                    ));
                }
            }
            for (j, a) in spec.scope().attachments().iter().enumerate() {
                if !secret_names.contains_key(a.secret()) {
                    return Err(invalid(
                        s.attach[j].span(),
                        &field(&format!("attach[{j}]")),
                        format!("secret {} has no [[secret]] table", a.secret()),
                    ));
                }
            }
        }
        Ok(())
    }

    /// What an operator must be told although the config is valid.
    pub fn warnings(&self) -> Vec<Warning> {
        let mut out = Vec::new();
        if !self.resolver.permit_internal.is_empty() {
            let nets: Vec<String> = self
                .resolver
                .permit_internal
                .iter()
                .map(|n| n.get_ref().to_string())
                .collect();
            out.push(Warning(format!(
                "resolver.permit_internal lets destinations resolve to internal addresses in {}: for labs and tests only",
                nets.join(", ")
            )));
        }
        if !self.upstream.extra_trust_anchors.is_empty() {
            out.push(Warning(
                "upstream.extra_trust_anchors adds trust anchors beside the public roots: for labs and tests only".into(),
            ));
        }
        if self.upstream.port != 443 {
            out.push(Warning(format!(
                "upstream.port is {}, not 443: for labs and tests only",
                self.upstream.port
            )));
        }
        out
    }
}

/// Every certificate in a PEM file; an error names the file and the fault.
pub fn read_pem_certs(
    path: &Path,
) -> Result<Vec<rustls::pki_types::CertificateDer<'static>>, String> {
    let pem = std::fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let certs: Result<Vec<_>, _> = rustls_pemfile::certs(&mut pem.as_slice()).collect();
    let certs = certs.map_err(|e| format!("{} is not PEM: {e}", path.display()))?;
    if certs.is_empty() {
        return Err(format!("{} holds no certificate", path.display()));
    }
    let mut store = rustls::RootCertStore::empty();
    for c in &certs {
        store
            .add(c.clone())
            .map_err(|e| format!("{} holds an unusable trust anchor: {e}", path.display()))?;
    }
    Ok(certs)
}

/// The private key in a PEM file that only its owner may access; an error
/// names the file and the fault, never the key.
pub fn read_private_key(path: &Path) -> Result<rustls::pki_types::PrivateKeyDer<'static>, String> {
    use rustls::pki_types::pem::PemObject;
    let mode = private_mode(path)?.ok_or_else(|| format!("{} does not exist", path.display()))?;
    if mode & 0o077 != 0 {
        return Err(format!(
            "{} has mode {mode:04o}: group and others must have no access (chmod 600)",
            path.display()
        ));
    }
    rustls::pki_types::PrivateKeyDer::from_pem_file(path)
        .map_err(|e| format!("{} holds no usable private key: {e}", path.display()))
}

/// A file that may be absent (it is then created, private) but, if present,
/// must be a regular file only its owner may access.
fn check_private_file(path: &Path) -> Result<(), String> {
    match private_mode(path)? {
        Some(mode) if mode & 0o077 != 0 => Err(format!(
            "{} has mode {mode:04o}: group and others must have no access (chmod 600)",
            path.display()
        )),
        _ => Ok(()),
    }
}

/// The permission bits of a regular file, or `None` if it does not exist.
fn private_mode(path: &Path) -> Result<Option<u32>, String> {
    use std::os::unix::fs::PermissionsExt;
    match std::fs::metadata(path) {
        Ok(m) if !m.is_file() => Err(format!("{} is not a regular file", path.display())),
        Ok(m) => Ok(Some(m.permissions().mode() & 0o777)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(format!("cannot read {}: {e}", path.display())),
    }
}

/// 1-based line number of byte offset `at` in `text`.
fn line_of(text: &str, at: usize) -> usize {
    text.as_bytes()[..at.min(text.len())]
        .iter()
        .filter(|&&b| b == b'\n')
        .count()
        + 1
}

/// A table header line's name and whether it opens an element of an
/// array of tables (`[[session]]`); `None` for any other line.
fn table_header(line: &str) -> Option<(&str, bool)> {
    let t = line.trim();
    let array = t.starts_with("[[");
    let name = t.strip_prefix('[')?.trim_start_matches('[');
    let name = name.split(']').next().unwrap_or(name);
    Some((name.trim(), array))
}

/// Span of the line that sets the dotted `field` (`control.listen`: key
/// `listen` under the `[control]` table; a bare key: before any table), or
/// of its table's header when the key is not set there; the start of the
/// file when neither is.
fn find_field(text: &str, field: &str) -> std::ops::Range<usize> {
    if let Some(line) = find_set(text, field) {
        return line;
    }
    let table = field.rsplit_once('.').map_or("", |(t, _)| t);
    if table.is_empty() {
        return 0..0;
    }
    let mut offset = 0;
    for line in text.split_inclusive('\n') {
        if table_header(line).is_some_and(|(name, _)| name == table) {
            return offset..offset + line.len();
        }
        offset += line.len();
    }
    0..0
}

/// Span of the line that sets the dotted `field`, if one does.
fn find_set(text: &str, field: &str) -> Option<std::ops::Range<usize>> {
    let (table, key) = field.rsplit_once('.').unwrap_or(("", field));
    let mut offset = 0;
    let mut current = "";
    for line in text.split_inclusive('\n') {
        if let Some((name, _)) = table_header(line) {
            current = name;
        } else if current == table {
            if let Some(rest) = line.trim().strip_prefix(key) {
                if rest.trim_start().starts_with('=') {
                    return Some(offset..offset + line.len());
                }
            }
        }
        offset += line.len();
    }
    None
}

/// The field the line holding byte `at` is about: `table.key` for a line
/// that sets a key (`session[1].sources`: elements of an array of tables
/// are numbered), the table for its header line or for another line in
/// it (a multi-line value's), none for such a line outside any table.
fn field_at(text: &str, at: usize) -> Option<String> {
    let mut offset = 0;
    let mut table = String::new();
    let mut elements: HashMap<&str, usize> = HashMap::new();
    for line in text.split_inclusive('\n') {
        let header = table_header(line);
        if let Some((name, array)) = header {
            table = if array {
                let n = elements.entry(name).or_insert(0);
                *n += 1;
                format!("{name}[{}]", *n - 1)
            } else {
                name.to_owned()
            };
        }
        offset += line.len();
        if at >= offset {
            continue;
        }
        let key = line
            .split_once('=')
            .map(|(k, _)| k.trim())
            .filter(|k| header.is_none() && !k.is_empty() && !k.starts_with('#'));
        return match (key, table.is_empty()) {
            (Some(key), true) => Some(key.to_owned()),
            (Some(key), false) => Some(format!("{table}.{key}")),
            (None, true) => None,
            (None, false) => Some(table),
        };
    }
    None
}

/// A TOML error as one line: where it points, the field there, the
/// library's message.
fn parse_error(path: &Path, text: &str, e: &toml::de::Error) -> ConfigError {
    let message = e.message().trim_end().replace('\n', " ");
    let Some(span) = e.span() else {
        return ConfigError::Parse {
            path: path.to_owned(),
            line: None,
            column: 0,
            field: None,
            message,
        };
    };
    let at = span.start.min(text.len());
    let line_start = text[..at].rfind('\n').map_or(0, |i| i + 1);
    // An empty span at the very start is about the whole document (a
    // missing top-level field): no line of it is at fault.
    // (An error at the end of the file is about its last line.)
    let field = if span.start == 0 && span.is_empty() {
        None
    } else {
        field_at(text, at.min(text.len().saturating_sub(1)))
    };
    ConfigError::Parse {
        path: path.to_owned(),
        line: Some(line_of(text, at)),
        column: text[line_start..at].chars().count() + 1,
        field,
        message,
    }
}

/// [`ConfigError::Parse`]'s text: `FILE:LINE: FIELD: MESSAGE (column C)`.
fn parse_text(
    path: &Path,
    line: Option<usize>,
    column: usize,
    field: Option<&str>,
    message: &str,
) -> String {
    let field = field.map(|f| format!("{f}: ")).unwrap_or_default();
    match line {
        Some(line) => format!(
            "{}:{line}: {field}{message} (column {column})",
            path.display()
        ),
        None => format!("{}: {field}{message}", path.display()),
    }
}

/// Span of the first line that sets `key`, for values that carry no span of
/// their own (plain numbers). Falls back to the start of the file.
fn find_key(text: &str, key: &str) -> std::ops::Range<usize> {
    let mut offset = 0;
    for line in text.split_inclusive('\n') {
        let t = line.trim_start();
        if let Some(rest) = t.strip_prefix(key) {
            if rest.trim_start().starts_with('=') {
                return offset..offset + line.len();
            }
        }
        offset += line.len();
    }
    0..0
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"
gateway_id = "gw-a"
[records]
path = "/tmp/records.jsonl"
[[session]]
id = "s1"
tenant = "acme"
sources = ["127.0.0.2"]
allowlist = ["API.example.com."]
"#;

    fn err(text: &str) -> String {
        Config::parse(Path::new("t.toml"), text)
            .expect_err("config should be refused")
            .to_string()
    }

    #[test]
    fn good_config_has_defaults_and_canonical_names() {
        let c = Config::parse(Path::new("t.toml"), GOOD).unwrap();
        assert_eq!(c.listen.data.port(), 443);
        assert_eq!(c.limits.hello_max_bytes, 16_640);
        assert_eq!(
            c.sessions[0].allowlist[0].get_ref().as_str(),
            "api.example.com"
        );
        assert!(c.warnings().is_empty());
    }

    #[test]
    fn errors_name_the_line_and_field() {
        let e = err(&GOOD.replace("127.0.0.2", "127.0.0.300"));
        assert!(
            e.starts_with("t.toml:8: session[0].sources: invalid IP address syntax"),
            "{e}"
        );
        let e = err(&GOOD.replace("tenant", "tenent"));
        assert!(
            e.starts_with("t.toml:7: session[0].tenent: unknown field `tenent`"),
            "{e}"
        );
        let e = err(&GOOD.replace("API.example.com.", "10.0.0.1"));
        assert!(
            e.starts_with("t.toml:9: session[0].allowlist: ") && e.contains("IP literal"),
            "{e}"
        );
        let e = err(&format!("{GOOD}[limits]\nhello_max_bytes = 10\n"));
        assert!(e.contains("t.toml:11: limits.hello_max_bytes"), "{e}");
        let twice = format!(
            "{GOOD}[[session]]\nid = \"s2\"\ntenant = \"b\"\nsources = [\"::ffff:127.0.0.2\"]\n"
        );
        let e = err(&twice);
        assert!(
            e.contains("t.toml:13: session[1].sources[0]") && e.contains("\"s1\""),
            "{e}"
        );
        let e = err(&GOOD.replace("gw-a", "gw a"));
        assert!(e.contains("t.toml:2: gateway_id"), "{e}");
    }

    #[test]
    fn runtime_workers_default_to_the_cpus_and_are_bounded() {
        let cpus = std::thread::available_parallelism().unwrap().get();
        let c = Config::parse(Path::new("t.toml"), GOOD).unwrap();
        assert_eq!(c.runtime.workers(), cpus);
        let one = format!("{GOOD}[runtime]\nworkers = 1\n");
        let c = Config::parse(Path::new("t.toml"), &one).unwrap();
        assert_eq!(c.runtime.workers(), 1);
        for bad in ["0", "1025"] {
            let e = err(&format!("{GOOD}[runtime]\nworkers = {bad}\n"));
            assert!(
                e.contains("t.toml:11: runtime.workers")
                    && e.contains(&format!("{bad} is outside 1-1024")),
                "{e}"
            );
        }
        let e = err(&format!("{GOOD}[runtime]\nworkers = -1\n"));
        assert!(e.starts_with("t.toml:11: runtime.workers: "), "{e}");
        let e = err(&format!("{GOOD}[runtime]\nthreads = 2\n"));
        assert!(e.starts_with("t.toml:11: runtime.threads: "), "{e}");
    }

    /// A syntax error is one line, as every other refusal: the file, the
    /// line, the field that line sets (or the table it is in), the column.
    #[test]
    fn syntax_errors_name_the_line_and_field() {
        let e = err(&format!("{GOOD}[limits]\nsession_connections = = 4\n"));
        assert!(
            e.starts_with("t.toml:11: limits.session_connections: ")
                && e.ends_with("(column 23)")
                && !e.contains('\n'),
            "{e}"
        );
        let e = err(&format!(
            "{GOOD}[[session]]\nid = \"s2\"\nsources = [\n\"1.2.3.4\",\n\"nope\"\n]\n"
        ));
        assert!(e.starts_with("t.toml:14: session[1]: "), "{e}");
        let e = err(&format!("{GOOD}[limits\n"));
        assert!(e.starts_with("t.toml:10: limits: "), "{e}");
        let e = err("[records]\npath = \"/tmp/r\"\n");
        assert!(e.starts_with("t.toml:1: missing field `gateway_id`"), "{e}");
    }

    /// A bound checked against another points at the one the file sets.
    #[test]
    fn a_cross_field_limit_points_at_the_field_at_fault() {
        let e = err(&format!(
            "{GOOD}[limits]\nsession_connections = 10\nsession_handshakes = 20\n"
        ));
        assert!(
            e.starts_with("t.toml:12: limits.session_handshakes: 20 is more than limits.session_connections (10)"),
            "{e}"
        );
        let e = err(&format!("{GOOD}[limits]\nsession_connections = 10\n"));
        assert!(
            e.starts_with("t.toml:11: limits.session_connections: 10 is less than limits.session_handshakes (64, its default)"),
            "{e}"
        );
    }

    /// `gateway reload` finds the socket in a file the gateway will refuse,
    /// even one TOML cannot read.
    #[test]
    fn the_process_socket_is_found_in_a_broken_file() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("g.toml");
        for (text, want) in [
            (
                format!("{GOOD}[process]\nsocket = \"/run/g.sock\"\n"),
                Some("/run/g.sock"),
            ),
            (
                format!("{GOOD}[limits]\nx = = 1\n[process]\nsocket = \"/run/g.sock\"\n"),
                Some("/run/g.sock"),
            ),
            (
                format!("process.socket = \"/run/g.sock\"\n{GOOD}[limits\n"),
                Some("/run/g.sock"),
            ),
            (
                format!("{GOOD}[limits]\nx = = 1\nsocket = \"/run/not\"\n"),
                None,
            ),
        ] {
            std::fs::write(&file, &text).unwrap();
            let got = Config::process_socket(&file).unwrap();
            assert_eq!(got.as_deref(), want.map(Path::new), "{text}");
        }
    }

    #[test]
    fn control_files_are_checked_and_the_key_must_be_private() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let key = private_key_file(dir.path());
        let cert = dir.path().join("cert.pem");
        let ca = talos_certs::SessionCa::new(&talos_certs::CaParams::new(
            "s1",
            1,
            "gw-a",
            vec!["api.example.com".to_owned()],
        ))
        .unwrap();
        std::fs::write(&cert, ca.cert_pem()).unwrap();
        let control = |key: &Path| {
            format!(
                "{GOOD}[control]\nlisten = \"127.0.0.1:0\"\nca_file = {cert:?}\ncert_file = {cert:?}\nkey_file = {key:?}\nsigning_key_file = {:?}\n",
                dir.path().join("signing.key")
            )
        };
        let c = Config::parse(Path::new("t.toml"), &control(&key)).unwrap();
        assert!(c.control.is_some());
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o640)).unwrap();
        let e = err(&control(&key));
        assert!(
            e.contains("t.toml:14: control.key_file") && e.contains("mode 0640"),
            "{e}"
        );
        let e = err(&control(&dir.path().join("missing.pem")));
        assert!(e.contains("t.toml:14: control.key_file"), "{e}");
        let e = err(&control(&key).replace("listen", "listen_on"));
        assert!(e.contains("listen_on"), "{e}");
        let e =
            err(&control(&key)
                .replace(&format!("ca_file = {cert:?}"), "ca_file = \"/nonexistent\""));
        assert!(e.contains("t.toml:12: control.ca_file"), "{e}");
    }

    /// A key file's PEM framing; only its mode and framing are checked
    /// when the config loads (rustls checks the key itself at start-up).
    const TEST_KEY_PEM: &str = "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n";

    fn private_key_file(dir: &Path) -> PathBuf {
        use std::os::unix::fs::PermissionsExt;
        let path = dir.join("key.pem");
        std::fs::write(&path, TEST_KEY_PEM).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        path
    }

    /// The contract's table of drafts, written as static sessions: each
    /// valid one loads, each invalid one is refused naming its field
    /// (sources and names that are no address or name are refused by the
    /// TOML types themselves, naming the key).
    #[test]
    fn the_shared_cases_hold_here() {
        for case in talos_contract::cases::CASES {
            let mut text = format!(
                "gateway_id = \"gw-a\"\n[records]\npath = \"/tmp/r.jsonl\"\n[[session]]\nid = {:?}\ntenant = {:?}\nattempt = {}\nsources = {:?}\nallowlist = {:?}\n",
                case.id, case.tenant, case.attempt, case.sources, case.allowlist
            );
            let attach: Vec<String> = (0..case.attachments.len())
                .map(|j| case.attach_text(j))
                .collect();
            text.push_str(&format!("attach = {attach:?}\n"));
            let mut secrets: Vec<&str> = case.attachments.iter().map(|a| a.0).collect();
            secrets.dedup();
            for secret in secrets {
                text.push_str(&format!("[[secret]]\nname = {secret:?}\nenv = \"T\"\n"));
            }
            let got = Config::parse(Path::new("t.toml"), &text);
            let Some(want) = case.want else {
                assert!(got.is_ok(), "{}: {:?}", case.name, got.err());
                continue;
            };
            let (name, key) = match want {
                Field::Id => ("id".to_owned(), "id"),
                Field::Attempt => ("attempt".into(), "attempt"),
                Field::Tenant => ("tenant".into(), "tenant"),
                Field::Sources => ("sources".into(), "sources"),
                Field::Source(j) => (format!("sources[{j}]"), "sources"),
                Field::Allowlist(j) => (format!("allowlist[{j}]"), "allowlist"),
                Field::Attachment(j, _) => (format!("attach[{j}]"), "attach"),
                other => panic!("{}: {other} is not in a static session", case.name),
            };
            match got {
                Err(ConfigError::Invalid { field, .. }) => {
                    assert_eq!(field, format!("session[0].{name}"), "{}", case.name)
                }
                Err(ConfigError::Parse { field, .. })
                    if matches!(want, Field::Source(_) | Field::Allowlist(_)) =>
                {
                    assert_eq!(
                        field.as_deref(),
                        Some(format!("session[0].{key}").as_str()),
                        "{}",
                        case.name
                    )
                }
                other => panic!("{}: {other:?}", case.name),
            }
        }
    }

    #[test]
    fn permit_internal_warns() {
        let text = GOOD.replace(
            "[records]",
            "[resolver]\npermit_internal = [\"127.0.0.0/8\"]\n[records]",
        );
        let c = Config::parse(Path::new("t.toml"), &text).unwrap();
        assert_eq!(c.warnings().len(), 1);
    }
}
