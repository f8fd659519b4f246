//! The gateway's configuration file (TOML).
//!
//! Every field, its unit and its default is documented in
//! `docs/configuration.md`; `ops/gateway.example.toml` is a complete example
//! that `gateway check-config` accepts. Loading is strict: an unknown field, a
//! bad value or two sessions claiming one source address stops start-up with
//! an error that names the field and the line at fault.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use ipnet::IpNet;
use serde::Deserialize;
use toml::Spanned;

mod error;
mod files;
mod restart;
mod static_session;
mod text;
mod validate;

pub use error::ConfigError;
pub use files::{read_pem_certs, read_private_key};
pub use static_session::StaticSession;
use text::{parse_error, table_header};

/// A value as the file set it, or its default, whose span is empty: a
/// number keeps where it was written, so that an error about it names its
/// line whatever the table or form (`[limits]`, `limits.x = …`, an inline
/// table) it was written in.
fn unset<T>(value: T) -> Spanned<T> {
    Spanned::new(0..0, value)
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
    /// The member link of a pair (`[pair]`). Optional: without it a member
    /// that holds no authority for a session refuses its connections.
    #[serde(default)]
    pub pair: Option<Pair>,
    /// The sessions' DNS, answered by the gateway (`[dns]`). Optional:
    /// without it the sessions' port 53 goes nowhere (`ops/nftables.conf`).
    #[serde(default)]
    pub dns: Option<Dns>,
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
    /// The control plane's `ControlPlane` service, `ADDR:PORT`, or a list
    /// of them (every replica of `control-stub serve`): where the gateway
    /// ships its signed batches of records and sends its proposals, to the
    /// first that answers, failing over to the next within seconds.
    /// Without it no batch is made: records go only to `[records] path`.
    #[serde(default)]
    pub plane: Option<Spanned<Planes>>,
    /// The DNS name the control plane's certificate must carry. Default
    /// `control-stub` (the name `control-stub init` gives it).
    #[serde(default = "Control::default_plane_name")]
    pub plane_name: Spanned<String>,
    /// Where sealed batches wait until the control plane acknowledges them
    /// (a directory, made mode 0700). Required with `plane`.
    #[serde(default)]
    pub spool_dir: Option<Spanned<PathBuf>>,
    /// The most records in one batch. Default 1000; range 1-10000.
    #[serde(default = "Control::default_batch_max_records")]
    pub batch_max_records: Spanned<usize>,
    /// The longest a record waits before its batch is sealed, in
    /// milliseconds. Default 1000; range 10-60000.
    #[serde(default = "Control::default_batch_interval_ms")]
    pub batch_interval_ms: Spanned<u64>,
    /// The most batches the spool holds unacknowledged. At the bound the
    /// gateway fails closed: it stops accepting new connections until the
    /// control plane acknowledges batches again. Default 1000; range
    /// 1-1000 (the control plane tells a re-sent batch from a forged one
    /// by the last 1,024 digests it accepted).
    #[serde(default = "Control::default_spool_max_batches")]
    pub spool_max_batches: Spanned<usize>,
    /// The most bytes the spool holds; the same fail-closed rule. Default
    /// 1 GiB; at least 1 MiB.
    #[serde(default = "Control::default_spool_max_bytes")]
    pub spool_max_bytes: Spanned<u64>,
    /// The lease of every authority the control plane opens, in
    /// milliseconds: an authority whose lease nobody renews within this
    /// time is dropped (reason `lease_expired`). Default 60000 (one
    /// minute); range 1000-3600000. Shorter ends the authority of a member
    /// cut off from the control plane sooner; longer rides out a longer
    /// control-plane outage (docs/operators.md, "Leases").
    #[serde(default = "Control::default_lease_ms")]
    pub lease_ms: Spanned<u64>,
}

/// `control.plane`: every replica of the control plane, in the order
/// given (one `ADDR:PORT`, or a list of them).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(try_from = "PlanesText")]
pub struct Planes(Vec<SocketAddr>);

/// `control.plane` as written: a string or a list of strings.
#[derive(Deserialize)]
#[serde(untagged, expecting = "ADDR:PORT, or a list of them")]
enum PlanesText {
    One(String),
    Several(Vec<String>),
}

impl TryFrom<PlanesText> for Planes {
    type Error = String;

    /// Each an `ADDR:PORT`; at least one, at most [`MAX_PLANES`], none
    /// twice.
    fn try_from(text: PlanesText) -> Result<Planes, String> {
        let texts = match text {
            PlanesText::One(a) => vec![a],
            PlanesText::Several(v) => v,
        };
        if texts.is_empty() {
            return Err("names no replica: give ADDR:PORT or a list of them".into());
        }
        if texts.len() > MAX_PLANES {
            return Err(format!(
                "names {} replicas; at most {MAX_PLANES}",
                texts.len()
            ));
        }
        let mut addrs: Vec<SocketAddr> = Vec::with_capacity(texts.len());
        for a in &texts {
            let addr = a
                .parse::<SocketAddr>()
                .map_err(|_| format!("{a:?} is not ADDR:PORT (an IP address and a port)"))?;
            if addrs.contains(&addr) {
                return Err(format!("names {addr} twice"));
            }
            addrs.push(addr);
        }
        Ok(Planes(addrs))
    }
}

impl Planes {
    /// Every replica, in the order given.
    pub fn addrs(&self) -> &[SocketAddr] {
        &self.0
    }
}

/// The most replicas `control.plane` names.
pub const MAX_PLANES: usize = 16;

impl Control {
    fn default_plane_name() -> Spanned<String> {
        unset("control-stub".into())
    }
    fn default_batch_max_records() -> Spanned<usize> {
        unset(1000)
    }
    fn default_lease_ms() -> Spanned<u64> {
        unset(60_000)
    }

    /// [`Control::lease_ms`] as a duration.
    pub fn lease(&self) -> std::time::Duration {
        std::time::Duration::from_millis(*self.lease_ms.get_ref())
    }
    fn default_batch_interval_ms() -> Spanned<u64> {
        unset(1000)
    }
    fn default_spool_max_batches() -> Spanned<usize> {
        unset(1000)
    }
    fn default_spool_max_bytes() -> Spanned<u64> {
        unset(1 << 30)
    }
}

/// The member link (`[pair]`): where the other members of the pair reach
/// this one, and where this one reaches them. A member that holds no
/// authority for a live session hands that session's connections,
/// untouched, to a member that holds it (`docs/operators.md`, "The
/// member link"). The link is mutual TLS with the control identities
/// (`[control]` is required): a peer must present a certificate of the
/// control CA with the gateway role and one of the `peers` ids as its
/// name.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Pair {
    /// Where peers connect, `ADDR:PORT`. Keep it off the session network
    /// (`ops/nftables.conf`): the link carries a session's source address.
    pub listen: Spanned<SocketAddr>,
    /// The other members: their gateway ids and link addresses.
    pub peers: Vec<Peer>,
    /// The most connections of one session this member forwards at once:
    /// it bounds what one session's forwarded connections may hold unread
    /// on either member (a stream window each, 1 MiB). That they never
    /// hold back another session's is the link's flow control
    /// (`gateway::member_link::stream`), not this bound. Default 256; range
    /// 1-100000.
    #[serde(default = "Pair::default_max_forwarded")]
    pub max_forwarded_per_session: Spanned<usize>,
    /// How often this member asks each peer, over the link, which
    /// authorities the peer holds and for how long (the holder's own
    /// word: a member cut off from the control plane, but not from its
    /// peer, still forwards), in milliseconds. Default 1000; range
    /// 100-60000.
    #[serde(default = "Pair::default_holdings_interval_ms")]
    pub holdings_interval_ms: Spanned<u64>,
}

impl Pair {
    fn default_max_forwarded() -> Spanned<usize> {
        unset(256)
    }
    fn default_holdings_interval_ms() -> Spanned<u64> {
        unset(1000)
    }
}

/// The sessions' DNS answerer (`[dns]`; see `gateway::dns`): UDP and TCP
/// on one address, where nftables redirects the sessions' port 53. A
/// session learns the addresses of the names it may reach, and nothing of
/// any other name; no query is ever passed on to a resolver as it came.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Dns {
    /// Where the sessions' queries arrive, `ADDR:PORT`, UDP and TCP.
    pub listen: Spanned<SocketAddr>,
    /// The addresses `approvals.hangar.internal` is given (the gateway's
    /// own on the session network: every port-443 connection reaches the
    /// gateway anyway). Default: the listen address's IP, when it is a
    /// specific one; required when `listen` is a wildcard.
    #[serde(default)]
    pub approvals: Vec<Spanned<std::net::IpAddr>>,
    /// The answers' time to live, in seconds. Default 30; range 1-300.
    #[serde(default = "Dns::default_ttl_s")]
    pub ttl_s: Spanned<u32>,
    /// Queries one session may make per second, on average (UDP and TCP
    /// together; beyond it UDP queries are dropped and TCP ones refused).
    /// Default 50; range 1-10000. The burst is twice this.
    #[serde(default = "Dns::default_qps")]
    pub queries_per_second: Spanned<u32>,
    /// TCP connections one session may hold open on the answerer at once.
    /// Default 8; range 1-1024.
    #[serde(default = "Dns::default_tcp")]
    pub max_tcp_per_session: Spanned<u32>,
    /// How often each session's counts (answered, refused, …) go on the
    /// record, in milliseconds; a session's last counts go at its end.
    /// Default 60000; range 1000-3600000.
    #[serde(default = "Dns::default_record_interval_ms")]
    pub record_interval_ms: Spanned<u64>,
}

impl Dns {
    fn default_ttl_s() -> Spanned<u32> {
        unset(30)
    }
    fn default_qps() -> Spanned<u32> {
        unset(50)
    }
    fn default_tcp() -> Spanned<u32> {
        unset(8)
    }
    fn default_record_interval_ms() -> Spanned<u64> {
        unset(60_000)
    }

    /// The addresses given for `approvals.hangar.internal`.
    pub fn approvals(&self) -> Vec<std::net::IpAddr> {
        if self.approvals.is_empty() {
            vec![self.listen.get_ref().ip()]
        } else {
            self.approvals.iter().map(|a| *a.get_ref()).collect()
        }
    }
}

/// One other member of the pair (`[[pair.peers]]`).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Peer {
    /// Its gateway id: the name its control certificate carries.
    pub id: Spanned<String>,
    /// Its `[pair] listen` address, `ADDR:PORT`.
    pub link: Spanned<SocketAddr>,
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
    pub timeout_ms: Spanned<u64>,
    /// How many times a query is sent before the name counts as
    /// unresolvable. Default 2.
    #[serde(default = "Resolver::default_attempts")]
    pub attempts: Spanned<usize>,
    /// Address blocks that are NOT refused `resolves_internal` although
    /// internal. Default empty. Only for labs and tests whose origins live on
    /// loopback; `check-config` and start-up warn when it is set.
    #[serde(default)]
    pub permit_internal: Vec<Spanned<IpNet>>,
}

impl Resolver {
    fn default_timeout_ms() -> Spanned<u64> {
        unset(2000)
    }
    fn default_attempts() -> Spanned<usize> {
        unset(2)
    }
    /// The per-query timeout.
    /// The resolver's settings, as [`crate::gate::resolve::Resolver::new`] takes them.
    pub fn settings(&self) -> crate::gate::resolve::Settings {
        crate::gate::resolve::Settings {
            nameservers: self.nameservers.iter().map(|n| *n.get_ref()).collect(),
            timeout: self.timeout(),
            attempts: *self.attempts.get_ref(),
            permit_internal: self.permit_internal.iter().map(|n| *n.get_ref()).collect(),
        }
    }

    pub fn timeout(&self) -> Duration {
        Duration::from_millis(*self.timeout_ms.get_ref())
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
    pub port: Spanned<u16>,
    /// How long a TCP connect to one resolved address may take, in
    /// milliseconds. Default 5000.
    #[serde(default = "Upstream::default_connect_timeout_ms")]
    pub connect_timeout_ms: Spanned<u64>,
    /// PEM files of CA certificates trusted for destinations IN ADDITION to
    /// the public roots (webpki-roots). Default empty. Only for labs and
    /// tests whose origins have their own test CA; start-up warns.
    #[serde(default)]
    pub extra_trust_anchors: Vec<Spanned<PathBuf>>,
}

impl Upstream {
    fn default_port() -> Spanned<u16> {
        unset(443)
    }
    fn default_connect_timeout_ms() -> Spanned<u64> {
        unset(5000)
    }
    /// The connect timeout.
    pub fn connect_timeout(&self) -> Duration {
        Duration::from_millis(*self.connect_timeout_ms.get_ref())
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
    pub hello_max_bytes: Spanned<usize>,
    /// How long a client has to send its whole ClientHello, in milliseconds.
    /// Default 5000. Slower senders are cut off (`not_tls`).
    #[serde(default = "Limits::default_hello_timeout_ms")]
    pub hello_timeout_ms: Spanned<u64>,
    /// How long the TLS handshake with the session may take once the hello
    /// is read, in milliseconds. Default 10000.
    #[serde(default = "Limits::default_handshake_timeout_ms")]
    pub handshake_timeout_ms: Spanned<u64>,
    /// The most client connections open at once; past it the gateway stops
    /// accepting until one closes (the kernel's backlog holds the rest).
    /// Default 20000.
    #[serde(default = "Limits::default_max_connections")]
    pub max_connections: Spanned<usize>,
    /// On SIGTERM/SIGINT, how long open connections may finish, in
    /// milliseconds, before they are cut. Default 10000.
    #[serde(default = "Limits::default_shutdown_grace_ms")]
    pub shutdown_grace_ms: Spanned<u64>,
    /// How long an HTTP/2 session connection may answer nothing before it
    /// is closed (gracefully: GOAWAY), in milliseconds. Default 60000, as
    /// an idle HTTP/1.1 connection waits for its next request.
    #[serde(default = "Limits::default_h2_idle_timeout_ms")]
    pub h2_idle_timeout_ms: Spanned<u64>,
    /// How long a session connection may be silent before TCP keep-alive
    /// probes it, in milliseconds; a peer that answers none of three probes
    /// (a third of this apart) is cut. Default 30000.
    #[serde(default = "Limits::default_tcp_keepalive_ms")]
    pub tcp_keepalive_ms: Spanned<u64>,
    /// Per session: connections open at once. Default 256.
    #[serde(default = "Limits::default_session_connections")]
    pub session_connections: Spanned<u32>,
    /// Per session: connections in the hello or the TLS handshake at once.
    /// Default 64.
    #[serde(default = "Limits::default_session_handshakes")]
    pub session_handshakes: Spanned<u32>,
    /// Per session: requests held for approval at once. Default 32.
    #[serde(default = "Limits::default_session_held_requests")]
    pub session_held_requests: Spanned<u32>,
    /// Per session: agent proposals waiting for a decision at once.
    /// Default 8.
    #[serde(default = "Limits::default_session_pending_proposals")]
    pub session_pending_proposals: Spanned<u32>,
    /// Per session: proposals (held requests' and agents') per minute, on
    /// average. Default 30.
    #[serde(default = "Limits::default_session_proposals_per_minute")]
    pub session_proposals_per_minute: Spanned<u32>,
    /// Per session: proposals that may come at once before the rate
    /// applies. Default 10.
    #[serde(default = "Limits::default_session_proposal_burst")]
    pub session_proposal_burst: Spanned<u32>,
    /// Per reply: the most bytes a coded reply may decode to. Default
    /// 1073741824 (1 GiB).
    #[serde(default = "Limits::default_reply_decoded_max_bytes")]
    pub reply_decoded_max_bytes: Spanned<u64>,
    /// Per reply: the most decoded bytes per coded byte, once past 1 MiB.
    /// Default 100.
    #[serde(default = "Limits::default_reply_decoded_max_ratio")]
    pub reply_decoded_max_ratio: Spanned<u64>,
}

impl Limits {
    fn default_hello_max_bytes() -> Spanned<usize> {
        unset(16_384 + 256)
    }
    fn default_hello_timeout_ms() -> Spanned<u64> {
        unset(5000)
    }
    fn default_handshake_timeout_ms() -> Spanned<u64> {
        unset(10_000)
    }
    fn default_max_connections() -> Spanned<usize> {
        unset(20_000)
    }
    fn default_shutdown_grace_ms() -> Spanned<u64> {
        unset(10_000)
    }
    fn default_h2_idle_timeout_ms() -> Spanned<u64> {
        unset(60_000)
    }
    fn default_tcp_keepalive_ms() -> Spanned<u64> {
        unset(30_000)
    }
    fn default_session_connections() -> Spanned<u32> {
        unset(256)
    }
    fn default_session_handshakes() -> Spanned<u32> {
        unset(64)
    }
    fn default_session_held_requests() -> Spanned<u32> {
        unset(32)
    }
    fn default_session_pending_proposals() -> Spanned<u32> {
        unset(8)
    }
    fn default_session_proposals_per_minute() -> Spanned<u32> {
        unset(30)
    }
    fn default_session_proposal_burst() -> Spanned<u32> {
        unset(10)
    }
    fn default_reply_decoded_max_bytes() -> Spanned<u64> {
        unset(crate::secrets::decode::Bounds::default().max_bytes)
    }
    fn default_reply_decoded_max_ratio() -> Spanned<u64> {
        unset(crate::secrets::decode::Bounds::default().max_ratio)
    }
    /// The HTTP/2 idle timeout.
    pub fn h2_idle_timeout(&self) -> Duration {
        Duration::from_millis(*self.h2_idle_timeout_ms.get_ref())
    }
    /// The TCP keep-alive idle time.
    pub fn tcp_keepalive(&self) -> Duration {
        Duration::from_millis(*self.tcp_keepalive_ms.get_ref())
    }
    /// The hello deadline.
    pub fn hello_timeout(&self) -> Duration {
        Duration::from_millis(*self.hello_timeout_ms.get_ref())
    }
    /// The session-side TLS handshake deadline.
    pub fn handshake_timeout(&self) -> Duration {
        Duration::from_millis(*self.handshake_timeout_ms.get_ref())
    }
    /// The drain grace.
    pub fn shutdown_grace(&self) -> Duration {
        Duration::from_millis(*self.shutdown_grace_ms.get_ref())
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
        if *self.upstream.port.get_ref() != 443 {
            out.push(Warning(format!(
                "upstream.port is {}, not 443: for labs and tests only",
                self.upstream.port.get_ref()
            )));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use talos_contract::spec::Field;

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
        assert_eq!(*c.limits.hello_max_bytes.get_ref(), 16_640);
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
    fn a_bad_value_in_an_inline_table_or_a_dotted_key_names_its_own_line() {
        // The line comes from where the value was parsed, whatever form the
        // table is written in: not from a search for `key =` at the start
        // of a line, which finds neither form (and would answer line 1).
        let inline = GOOD.replacen(
            "[records]",
            "limits = { hello_timeout_ms = 5000, max_connections = 0 }\n[records]",
            1,
        );
        let e = err(&inline);
        assert!(e.starts_with("t.toml:3: limits.max_connections"), "{e}");
        let dotted = GOOD.replacen("[records]", "\nlimits.hello_max_bytes = 10\n[records]", 1);
        let e = err(&dotted);
        assert!(e.starts_with("t.toml:4: limits.hello_max_bytes"), "{e}");
        let e = err(&GOOD.replacen(
            "[records]",
            "resolver = { timeout_ms = 1000 }\nupstream = { port = 0 }\n[records]",
            1,
        ));
        assert!(e.starts_with("t.toml:4: upstream.port"), "{e}");
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

    /// A certificate (PEM) in `dir`, for the `[control]` file checks.
    fn cert_file(dir: &Path) -> std::path::PathBuf {
        let cert = dir.join("cert.pem");
        let ca = talos_certs::SessionCa::new(&talos_certs::CaParams::new(
            "s1",
            1,
            "gw-a",
            vec!["api.example.com".to_owned()],
        ))
        .unwrap();
        std::fs::write(&cert, ca.cert_pem()).unwrap();
        cert
    }

    #[test]
    fn control_files_are_checked_and_the_key_must_be_private() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let key = private_key_file(dir.path());
        let cert = cert_file(dir.path());
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

    /// `control.plane`: one replica or a list of them; an empty list, one
    /// named twice, or too many are refused at the line.
    #[test]
    fn the_control_plane_is_one_address_or_a_list_of_replicas() {
        let dir = tempfile::tempdir().unwrap();
        let key = private_key_file(dir.path());
        let cert = cert_file(dir.path());
        let control = |plane: &str| {
            format!(
                "{GOOD}[control]
listen = \"127.0.0.1:0\"
ca_file = {cert:?}
cert_file = {cert:?}
key_file = {key:?}
signing_key_file = {:?}
spool_dir = {:?}
plane = {plane}
",
                dir.path().join("signing.key"),
                dir.path().join("spool"),
            )
        };
        let addrs = |text: &str| {
            Config::parse(Path::new("t.toml"), &control(text))
                .unwrap()
                .control
                .unwrap()
                .plane
                .unwrap()
                .get_ref()
                .addrs()
                .to_vec()
        };
        let one: SocketAddr = "127.0.0.1:7443".parse().unwrap();
        let two: SocketAddr = "[::1]:7444".parse().unwrap();
        assert_eq!(addrs("\"127.0.0.1:7443\""), [one]);
        assert_eq!(addrs("[\"127.0.0.1:7443\", \"[::1]:7444\"]"), [one, two]);
        let e = err(&control("[]"));
        assert!(
            e.starts_with("t.toml:17: control.plane: names no replica"),
            "{e}"
        );
        let e = err(&control("[\"127.0.0.1:7443\", \"127.0.0.1:7443\"]"));
        assert!(
            e.starts_with("t.toml:17: control.plane: names 127.0.0.1:7443 twice"),
            "{e}"
        );
        let many: Vec<String> = (0..17)
            .map(|i| format!("\"127.0.0.1:{}\"", 7000 + i))
            .collect();
        let e = err(&control(&format!("[{}]", many.join(", "))));
        assert!(
            e.contains("control.plane: names 17 replicas; at most 16"),
            "{e}"
        );
        let e = err(&control("[\"127.0.0.1\"]"));
        assert!(
            e.starts_with("t.toml:17: control.plane: \"127.0.0.1\" is not ADDR:PORT"),
            "{e}"
        );
        let e = err(&control("7443"));
        assert!(
            e.starts_with("t.toml:17: control.plane: ")
                && e.contains("ADDR:PORT, or a list of them"),
            "{e}"
        );
    }

    /// `[pair]` needs `[control]` and names other members, each once; a
    /// bad one is refused at its line.
    #[test]
    fn the_member_link_is_checked() {
        let dir = tempfile::tempdir().unwrap();
        let key = private_key_file(dir.path());
        let cert = cert_file(dir.path());
        let control = format!(
            "[control]\nlisten = \"127.0.0.1:0\"\nca_file = {cert:?}\ncert_file = {cert:?}\nkey_file = {key:?}\nsigning_key_file = {:?}\n",
            dir.path().join("signing.key")
        );
        let pair =
            |peers: &str| format!("[pair]\nlisten = \"127.0.0.1:8444\"\npeers = [\n{peers}\n]\n");
        let good = pair("{ id = \"gw-b\", link = \"127.0.0.1:8445\" }");
        let c = Config::parse(Path::new("t.toml"), &format!("{GOOD}{control}{good}")).unwrap();
        let p = c.pair.as_ref().unwrap();
        assert_eq!(p.peers.len(), 1);
        assert_eq!(*p.max_forwarded_per_session.get_ref(), 256);
        assert_eq!(*p.holdings_interval_ms.get_ref(), 1000);
        let e = err(&format!("{GOOD}{good}"));
        assert!(
            e.starts_with("t.toml:11: pair.listen: needs [control]"),
            "{e}"
        );
        let e = err(&format!("{GOOD}{control}{}", pair("")));
        assert!(e.contains("pair.peers: name at least one"), "{e}");
        let e = err(&format!(
            "{GOOD}{control}{}",
            pair("{ id = \"gw-a\", link = \"127.0.0.1:8445\" }")
        ));
        assert!(
            e.starts_with("t.toml:19: pair.peers.id: \"gw-a\" is this gateway's own id"),
            "{e}"
        );
        let e = err(&format!(
            "{GOOD}{control}{}",
            pair("{ id = \"gw-b\", link = \"127.0.0.1:8445\" },\n{ id = \"gw-b\", link = \"127.0.0.1:8446\" }")
        ));
        assert!(
            e.starts_with("t.toml:20: pair.peers.id: \"gw-b\" is named twice"),
            "{e}"
        );
        let e = err(&format!("{GOOD}{control}{good}holdings_interval_ms = 5\n"));
        assert!(
            e.contains("pair.holdings_interval_ms: 5 is outside 100-60000"),
            "{e}"
        );
        let e = err(&format!("{GOOD}{control}{good}forward = true\n"));
        assert!(e.contains("unknown field `forward`"), "{e}");
    }

    #[test]
    fn the_dns_table_is_checked_and_only_a_restart_changes_it() {
        let dns = |lines: &str| format!("{GOOD}[dns]\n{lines}");
        let c = Config::parse(Path::new("t.toml"), &dns("listen = \"10.0.0.10:53\"\n")).unwrap();
        let d = c.dns.as_ref().unwrap();
        assert_eq!(*d.ttl_s.get_ref(), 30);
        assert_eq!(*d.queries_per_second.get_ref(), 50);
        assert_eq!(*d.max_tcp_per_session.get_ref(), 8);
        assert_eq!(*d.record_interval_ms.get_ref(), 60_000);
        assert_eq!(
            d.approvals(),
            ["10.0.0.10".parse::<std::net::IpAddr>().unwrap()]
        );
        let e = err(&dns("listen = \"0.0.0.0:53\"\n"));
        assert!(
            e.starts_with(
                "t.toml:11: dns.listen: 0.0.0.0:53 is a wildcard: name the gateway's address"
            ),
            "{e}"
        );
        let c = Config::parse(
            Path::new("t.toml"),
            &dns("listen = \"0.0.0.0:53\"\napprovals = [\"10.0.0.10\"]\n"),
        )
        .unwrap();
        assert_eq!(c.dns.as_ref().unwrap().approvals().len(), 1);
        let e = err(&dns(
            "listen = \"10.0.0.10:53\"\napprovals = [\"0.0.0.0\"]\n",
        ));
        assert!(
            e.starts_with("t.toml:12: dns.approvals: 0.0.0.0 cannot be connected to"),
            "{e}"
        );
        for (line, says) in [
            ("ttl_s = 0", "dns.ttl_s: 0 is outside 1-300"),
            ("ttl_s = 3600", "dns.ttl_s: 3600 is outside 1-300"),
            (
                "queries_per_second = 0",
                "dns.queries_per_second: 0 is outside 1-10000",
            ),
            (
                "max_tcp_per_session = 5000",
                "dns.max_tcp_per_session: 5000 is outside 1-1024",
            ),
            (
                "record_interval_ms = 10",
                "dns.record_interval_ms: 10 is outside 1000-3600000",
            ),
            ("recursion = true", "unknown field `recursion`"),
        ] {
            let e = err(&dns(&format!("listen = \"10.0.0.10:53\"\n{line}\n")));
            assert!(
                e.starts_with("t.toml:12: ") && e.contains(says),
                "{line}: {e}"
            );
        }
        let e = err(&dns("ttl_s = 30\n"));
        assert!(e.contains("missing field `listen`"), "{e}");
        // Every field is one only a restart changes.
        let a = Config::parse(Path::new("t.toml"), &dns("listen = \"10.0.0.10:53\"\n")).unwrap();
        let b = Config::parse(
            Path::new("t.toml"),
            &dns("listen = \"10.0.0.10:53\"\nttl_s = 5\n"),
        )
        .unwrap();
        let running = a.restart_only();
        let e = b
            .check_restart_only(Path::new("t.toml"), &running)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("t.toml:12: dns.ttl_s: changes only with a restart"),
            "{e}"
        );
        let none = Config::parse(Path::new("t.toml"), GOOD).unwrap();
        let e = a
            .check_restart_only(Path::new("t.toml"), &none.restart_only())
            .unwrap_err()
            .to_string();
        assert!(e.contains("dns"), "{e}");
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
