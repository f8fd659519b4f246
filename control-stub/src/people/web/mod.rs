//! The web app people use: approvers decide cards on their phones,
//! operators look at sessions and start Revoke All. `serve --web-listen`
//! runs it; `docs/people.md` says what it does for people and why.
//!
//! # A component
//!
//! [`WebConfig::bind`] checks everything that can fail before anything
//! runs (the certificate and key, the address, push's settings) and binds
//! the listener; [`Bound::start`] opens the app's store connections,
//! starts Web Push and the card watch, and serves; [`Running::stop`] stops
//! it in order: no new connection, every connection told to finish (the
//! card streams end at once), what is left after the grace cut, the card
//! watch stopped, push's queued messages delivered within what is left of
//! the grace. [`Running::card_hook`] is what the relay calls when a card
//! starts waiting (Web Push, and the live streams woken at once).
//!
//! # The listener
//!
//! HTTPS only: TLS 1.3 (rustls, aws-lc), the certificate given for the
//! public name (`--web-cert`, `--web-key`), ALPN `h2` and `http/1.1`.
//! When the control directory holds an operator CA (`init`), the listener
//! asks for an **optional** client certificate (rustls'
//! `WebPkiClientVerifier`, unauthenticated clients allowed: a browser with
//! none goes on as before), accepted under the operator CA or the control
//! CA; the `/v1/` routes take an operator only from the operator CA
//! ([`crate::identity::OperatorTrust`]), so a gateway's certificate is
//! refused there by name (403), and one under any other CA ends the
//! handshake. At
//! most [`MAX_CONNECTIONS`] connections; [`HANDSHAKE_TIMEOUT`] for a TLS
//! handshake and for a request's headers; request heads of at most
//! [`MAX_HEAD`] bytes, bodies of at most [`MAX_BODY`]; HTTP/2 with at most
//! [`MAX_STREAMS_PER_CONNECTION`] streams on a connection.
//!
//! # Layout
//!
//! - `answer`: every answer's headers (CSP, HSTS, …) and the JSON error
//!   form, written in one place.
//! - `assets`: the pages, script, style, icon, manifest and service
//!   worker, compiled into the binary.
//! - `views`: what a card, a session and a history line look like to the
//!   page, every field of the session's through [`super::text`].
//! - `pool`: the app's own store connections.
//! - `watch`: the card watch (the store polled on every replica, the
//!   relay's hook).
//! - `app`: what every request is served with (`App`), what the app works
//!   with besides its config (`Deps`), the bounds the routes read.
//! - `live`: the live card streams (server-sent events).
//! - `api`: the routes: pages, sign-in and enrolment, cards and
//!   decisions, sessions and Revoke All, push subscriptions.

mod answer;
mod assets;
mod views;
mod pool;
mod watch;
mod app;
mod live;
mod api;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use talos_contract::sync::Locked;
use tokio::net::TcpListener;
use tokio::sync::{watch as tokio_watch, Semaphore};
use tokio::task::{JoinHandle, JoinSet};
use tokio_rustls::TlsAcceptor;

use super::push::{Push, PushArgs, PushConfig, PushTask};
use super::rp::RelyingParty;
use crate::error::Error;
use crate::store::Store;

pub use self::answer::CSP;
use self::app::App;
pub use self::app::{system_clock, Clock, Deps, Links, SharedLink, MAX_BODY};
use self::pool::Pool;
use self::watch::stopped;
pub use self::watch::{CardHook, POLL_INTERVAL};

/// Connections served at once: a team's phones and laptops, each with a
/// page or two open, many times over. More wait in the listen queue.
pub const MAX_CONNECTIONS: usize = 256;

/// How long a client has for its TLS handshake, and for each request's
/// head: a stalled client must not hold a connection slot.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// The largest request head (line and headers) read: 16 KiB. A browser's
/// is well under 2 KiB here (one cookie, a few headers).
pub const MAX_HEAD: usize = 16 * 1024;

/// HTTP/2 streams at once on one connection: a page's requests are made
/// one at a time, beside one card stream; tabs share a connection.
pub const MAX_STREAMS_PER_CONNECTION: u32 = 32;

/// Store connections the app holds (each request takes one for its
/// transactions): reads go on while a decision holds one waiting for the
/// gateway.
pub const STORE_CONNECTIONS: usize = 4;

/// The link [`following_members`] made last, with the members it reaches.
pub type KeptLink = Arc<Mutex<Option<(Vec<String>, SharedLink)>>>;

/// Always `link` (a test's gateways).
pub fn fixed_link(link: SharedLink) -> Links {
    Arc::new(move |_| Ok(link.clone()))
}

/// The members as `serve` reaches them: `targets` (the store's members
/// merged with `--gateway`, as `serve` merges them) each time a request
/// needs them, the link made again when they changed since the last one
/// (a member added or moved while `serve` runs is reached without a
/// restart). The last link made stays in `keep`, for the caller to drop
/// outside any runtime (a link owns a runtime of its own).
pub fn following_members(
    targets: impl Fn(&Store) -> Result<Vec<String>, Error> + Send + Sync + 'static,
    control_dir: Option<PathBuf>,
    keep: KeptLink,
) -> Links {
    Arc::new(move |store: &Store| {
        let now = targets(store)?;
        let mut kept = keep.locked();
        if let Some((t, link)) = kept.as_ref() {
            if *t == now {
                return Ok(link.clone());
            }
        }
        let link: SharedLink = Arc::new(
            crate::grpc_link::GrpcLink::new(&now, control_dir.clone()).map_err(Error::Link)?,
        );
        // The link replaced is dropped here, on the blocking thread the
        // request's store work runs on (its runtime may be dropped there).
        *kept = Some((now, link.clone()));
        Ok(link)
    })
}

/// The web app's settings on `serve`'s command line (flattened into it).
#[derive(Clone, Debug, Default, clap::Args)]
pub struct WebArgs {
    /// Serve the people's web app over HTTPS on this address (port 0: any
    /// free port). Needs --web-origin, --web-cert and --web-key.
    #[arg(id = "web-listen", long = "web-listen", value_name = "ADDR")]
    pub listen: Option<SocketAddr>,
    /// The web app's origin as people's browsers reach it,
    /// https://NAME[:PORT] (passkeys are bound to it).
    #[arg(id = "web-origin", long = "web-origin", value_name = "URL")]
    pub origin: Option<String>,
    /// The WebAuthn rp id: the origin's host (the default) or a domain it
    /// is under.
    #[arg(id = "web-rp-id", long = "web-rp-id", value_name = "NAME")]
    pub rp_id: Option<String>,
    /// The PEM certificate chain for the origin's host name.
    #[arg(id = "web-cert", long = "web-cert", value_name = "FILE")]
    pub cert: Option<PathBuf>,
    /// Its PEM private key.
    #[arg(id = "web-key", long = "web-key", value_name = "FILE")]
    pub key: Option<PathBuf>,
    #[command(flatten)]
    pub push: PushArgs,
}

/// How the web app runs, checked.
#[derive(Clone, Debug)]
pub struct WebConfig {
    pub listen: SocketAddr,
    pub rp: RelyingParty,
    pub cert: PathBuf,
    pub key: PathBuf,
    /// Web Push, when on.
    pub push: Option<PushConfig>,
    /// The operator CA (and the control CA) client certificates are taken
    /// under; none: no client certificate is asked for.
    pub operators: Option<crate::identity::OperatorTrust>,
}

impl WebArgs {
    /// The config these settings give; `None` without `--web-listen`.
    pub fn config(&self) -> Result<Option<WebConfig>, Error> {
        let Some(listen) = self.listen else {
            let stray = self.origin.is_some()
                || self.rp_id.is_some()
                || self.cert.is_some()
                || self.key.is_some()
                || self.push.contact.is_some();
            if stray {
                return Err(super::rp::web_invalid(
                    "--web-origin, --web-rp-id, --web-cert, --web-key and --push-contact need --web-listen",
                ));
            }
            return Ok(None);
        };
        let need = |flag: &str| super::rp::web_invalid(format!("--web-listen needs {flag}"));
        let origin = self
            .origin
            .clone()
            .ok_or_else(|| need("--web-origin URL"))?;
        let host = super::rp::origin_host(&origin)?;
        let rp_id = self.rp_id.clone().unwrap_or(host);
        Ok(Some(WebConfig {
            listen,
            rp: RelyingParty::new(&origin, &rp_id)?,
            cert: self.cert.clone().ok_or_else(|| need("--web-cert FILE"))?,
            key: self.key.clone().ok_or_else(|| need("--web-key FILE"))?,
            push: self.push.config()?,
            operators: None,
        }))
    }
}

/// A TLS 1.3 server config with the certificate chain and key in the PEM
/// files; ALPN h2, http/1.1; an optional client certificate under
/// `client_roots` when given (see the module docs).
pub fn tls_config(
    cert: &std::path::Path,
    key: &std::path::Path,
    client_roots: Option<Arc<rustls::RootCertStore>>,
) -> Result<rustls::ServerConfig, Error> {
    use rustls::pki_types::pem::PemObject as _;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let io = |path: &std::path::Path, reason: String| Error::Io {
        what: path.display().to_string(),
        reason,
    };
    let chain = CertificateDer::pem_file_iter(cert)
        .map_err(|e| io(cert, e.to_string()))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| io(cert, format!("certificate PEM: {e}")))?;
    if chain.is_empty() {
        return Err(io(cert, "no certificate".into()));
    }
    let key_der =
        PrivateKeyDer::from_pem_file(key).map_err(|e| io(key, format!("no private key: {e}")))?;
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let builder = rustls::ServerConfig::builder_with_provider(Arc::clone(&provider))
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|e| io(cert, e.to_string()))?;
    let builder = match client_roots {
        Some(roots) => {
            let verifier =
                rustls::server::WebPkiClientVerifier::builder_with_provider(roots, provider)
                    .allow_unauthenticated()
                    .build()
                    .map_err(|e| io(cert, format!("client certificate verifier: {e}")))?;
            builder.with_client_cert_verifier(verifier)
        }
        None => builder.with_no_client_auth(),
    };
    let mut config = builder.with_single_cert(chain, key_der).map_err(|e| {
        io(
            cert,
            format!("the certificate and key do not go together: {e}"),
        )
    })?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(config)
}

impl WebConfig {
    /// Load the certificate and key and bind the listener: everything that
    /// can fail, before anything runs.
    pub async fn bind(self) -> Result<Bound, Error> {
        let listener = TcpListener::bind(self.listen)
            .await
            .map_err(|e| Error::Io {
                what: format!("--web-listen {}", self.listen),
                reason: e.to_string(),
            })?;
        self.bound(listener)
    }

    /// [`WebConfig::bind`] on a listener bound already (a socket handed
    /// over, or one a test bound to learn its port before it names the
    /// origin); `listen` is not read. Inside a Tokio runtime.
    pub fn bind_on(self, listener: std::net::TcpListener) -> Result<Bound, Error> {
        let io = |e: std::io::Error| Error::Io {
            what: "--web-listen".into(),
            reason: e.to_string(),
        };
        listener.set_nonblocking(true).map_err(io)?;
        self.bound(TcpListener::from_std(listener).map_err(io)?)
    }

    fn bound(self, listener: TcpListener) -> Result<Bound, Error> {
        let tls = tls_config(
            &self.cert,
            &self.key,
            self.operators
                .as_ref()
                .map(crate::identity::OperatorTrust::tls_roots),
        )?;
        let addr = listener.local_addr().map_err(|e| Error::Io {
            what: "--web-listen".into(),
            reason: e.to_string(),
        })?;
        Ok(Bound {
            listener,
            tls: Arc::new(tls),
            addr,
            config: self,
        })
    }
}

/// The listener bound, not yet serving.
#[derive(Debug)]
pub struct Bound {
    listener: TcpListener,
    tls: Arc<rustls::ServerConfig>,
    addr: SocketAddr,
    config: WebConfig,
}

impl Bound {
    /// Where it listens.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// The relying party it serves.
    pub fn rp(&self) -> &RelyingParty {
        &self.config.rp
    }

    /// Serve (inside a Tokio runtime): [`Bound::open`], then
    /// [`Running::serve`].
    pub async fn start(self, deps: Deps) -> Result<Running, Error> {
        let mut running = self.open(deps).await?;
        running.serve();
        Ok(running)
    }

    /// Open (inside a Tokio runtime): the store connections opened, Web
    /// Push and the card watch started, the card hook made; no connection
    /// accepted until [`Running::serve`].
    pub async fn open(self, mut deps: Deps) -> Result<Running, Error> {
        let db = deps.db.clone();
        let push_on = self.config.push.is_some();
        let (rp_id, origin) = (
            self.config.rp.rp_id().to_owned(),
            self.config.rp.origin().to_owned(),
        );
        let (pool, push_store) = tokio::task::spawn_blocking(move || {
            // Every open from now on carries this relying party to the
            // gateways, which check people's assertions against it.
            Store::open(&db)?.write(|tx| {
                use crate::store::settings::{WEB_ORIGIN, WEB_RP_ID};
                tx.set_setting(WEB_RP_ID, &rp_id, "serve")?;
                tx.set_setting(WEB_ORIGIN, &origin, "serve")
            })?;
            let pool = Pool::open(&db, STORE_CONNECTIONS)?;
            let push_store = if push_on {
                Some(Store::open(&db)?)
            } else {
                None
            };
            Ok::<_, Error>((pool, push_store))
        })
        .await
        .map_err(|e| Error::Store(format!("web app start: {e}")))??;
        let (push, push_task) = match (&self.config.push, &deps.vapid, push_store) {
            (Some(config), Some(_), Some(push_store)) => {
                let key = deps.vapid.take().ok_or_else(|| Error::PushConfigInvalid {
                    reason: "push is on but no VAPID key was loaded".into(),
                })?;
                let (push, task) =
                    Push::start(config.clone(), key, Arc::new(Mutex::new(push_store)))?;
                (Some(push), Some(task))
            }
            (Some(_), _, _) => {
                return Err(Error::PushConfigInvalid {
                    reason: "push is on but no VAPID key was loaded".into(),
                })
            }
            (None, _, _) => (None, None),
        };
        let (stop_tx, stop_rx) = tokio_watch::channel(false);
        let pool = Arc::new(pool);
        let watch = watch::Watch::new();
        let poller = tokio::spawn(watch::poll(
            watch.clone(),
            Arc::clone(&pool),
            stop_rx.clone(),
        ));
        let hook = watch::hook(watch.clone(), push.clone());
        let app = Arc::new(App {
            rp: self.config.rp.clone(),
            operators: self.config.operators.clone(),
            pool,
            deps,
            push,
            watch,
            shutdown: stop_rx.clone(),
        });
        let (grace_tx, grace_rx) = tokio_watch::channel(Duration::ZERO);
        let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
        Ok(Running {
            addr: self.addr,
            stop: stop_tx,
            grace: grace_tx,
            pending: Some(Pending {
                listener: self.listener,
                tls: self.tls,
                app,
                stop: stop_rx,
                grace: grace_rx,
            }),
            accept: None,
            poller,
            push: push_task,
            hook,
            slots,
        })
    }
}

/// The accept loop's listener, TLS, app and signals, before it runs.
struct Pending {
    listener: TcpListener,
    tls: Arc<rustls::ServerConfig>,
    app: Arc<App>,
    stop: tokio_watch::Receiver<bool>,
    grace: tokio_watch::Receiver<Duration>,
}

/// The web app opened, and serving once [`Running::serve`] was called.
pub struct Running {
    addr: SocketAddr,
    stop: tokio_watch::Sender<bool>,
    grace: tokio_watch::Sender<Duration>,
    /// What the accept loop starts with, until [`Running::serve`].
    pending: Option<Pending>,
    accept: Option<JoinHandle<()>>,
    poller: JoinHandle<()>,
    push: Option<PushTask>,
    hook: CardHook,
    /// The accept loop's connection slots: those taken are the
    /// connections open.
    slots: Arc<Semaphore>,
}

impl std::fmt::Debug for Running {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Running")
            .field("addr", &self.addr)
            .finish_non_exhaustive()
    }
}

impl Running {
    /// Where it listens.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// What the relay calls when a new card starts waiting, with the store
    /// it received the card in: the card's approvers' devices are pushed
    /// to, and the live card streams here are woken at once (those of the
    /// other replicas see it at their next poll of the store).
    pub fn card_hook(&self) -> CardHook {
        Arc::clone(&self.hook)
    }

    /// Stop, in order (see the module docs), within `grace`.
    pub async fn stop(self, grace: Duration) {
        let deadline = tokio::time::Instant::now() + grace;
        self.close(grace);
        self.finish(deadline).await;
    }

    /// Accept connections (once; inside a Tokio runtime).
    pub fn serve(&mut self) {
        if let Some(p) = self.pending.take() {
            self.accept = Some(tokio::spawn(accept(
                p.listener,
                p.tls,
                p.app,
                Arc::clone(&self.slots),
                p.stop,
                p.grace,
            )));
        }
    }

    /// The first half of [`Running::stop`]: no new connection, every
    /// connection told to finish (the card streams end at once), those
    /// still open after `grace` to be cut. Returns the connections open.
    pub fn close(&self, grace: Duration) -> usize {
        let open = MAX_CONNECTIONS.saturating_sub(self.slots.available_permits());
        let _ = self.grace.send(grace);
        let _ = self.stop.send(true);
        open
    }

    /// The second half of [`Running::stop`]: the connections finished (or
    /// cut at the grace), the card watch stopped, push's queued messages
    /// delivered until `deadline`.
    pub async fn finish(mut self, deadline: tokio::time::Instant) {
        // Never served: its socket closes here.
        drop(self.pending.take());
        if let Some(accept) = self.accept {
            let _ = accept.await;
        }
        let _ = self.poller.await;
        if let Some(push) = self.push {
            push.stop(deadline.saturating_duration_since(tokio::time::Instant::now()))
                .await;
        }
    }
}

/// The accept loop: at most [`MAX_CONNECTIONS`] at once, each TLS
/// handshake within [`HANDSHAKE_TIMEOUT`], each connection on a task of
/// its own; at `stop`, no more accepted, every connection told to finish,
/// and those left after the grace cut.
async fn accept(
    listener: TcpListener,
    tls: Arc<rustls::ServerConfig>,
    app: Arc<App>,
    slots: Arc<Semaphore>,
    mut stop: tokio_watch::Receiver<bool>,
    grace: tokio_watch::Receiver<Duration>,
) {
    let acceptor = TlsAcceptor::from(tls);
    let mut conns = JoinSet::new();
    loop {
        while conns.try_join_next().is_some() {}
        let permit = tokio::select! {
            () = stopped(&mut stop) => break,
            p = Arc::clone(&slots).acquire_owned() => match p {
                Ok(p) => p,
                Err(_) => break,
            },
        };
        let (tcp, peer) = tokio::select! {
            () = stopped(&mut stop) => break,
            a = listener.accept() => match a {
                Ok(a) => a,
                // A failed accept (out of descriptors, say) is the
                // connection's, not the listener's.
                Err(_) => continue,
            },
        };
        let acceptor = acceptor.clone();
        let app = Arc::clone(&app);
        conns.spawn(async move {
            let _permit = permit;
            let tls = match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                Ok(Ok(tls)) => tls,
                Ok(Err(e)) => {
                    log_refused(peer, &e.to_string());
                    return;
                }
                Err(_) => {
                    log_refused(peer, "handshake timed out");
                    return;
                }
            };
            // The client's certificates, if it presented any (verified
            // under the CAs above): what the `/v1/` routes read.
            let certs = tls
                .get_ref()
                .1
                .peer_certificates()
                .map(|c| Arc::new(c.iter().map(|c| c.clone().into_owned()).collect()));
            serve_conn(tls, peer, certs, app).await;
        });
    }
    drop(listener);
    let grace = *grace.borrow();
    let drained =
        tokio::time::timeout(grace, async { while conns.join_next().await.is_some() {} }).await;
    if drained.is_err() {
        let left = conns.len();
        conns.abort_all();
        while conns.join_next().await.is_some() {}
        eprintln!(
            "{}",
            serde_json::json!({"web": "stopped", "detail": "connections still open at the end of the grace were cut", "connections": left})
        );
    }
}

fn log_refused(peer: SocketAddr, why: &str) {
    eprintln!(
        "{}",
        serde_json::json!({"web_connection_refused": peer.to_string(), "reason": why})
    );
}

/// One connection, HTTP/2 or HTTP/1.1 as ALPN chose, until it ends or the
/// app stops (then told to finish its requests and close).
async fn serve_conn(
    tls: tokio_rustls::server::TlsStream<tokio::net::TcpStream>,
    peer: SocketAddr,
    certs: Option<api::PeerCerts>,
    app: Arc<App>,
) {
    let h2 = tls.get_ref().1.alpn_protocol() == Some(b"h2");
    let mut stop = app.shutdown.clone();
    let service = hyper::service::service_fn(move |req| {
        let app = Arc::clone(&app);
        let certs = certs.clone();
        async move {
            Ok::<_, std::convert::Infallible>(api::handle(&app, req, peer, certs.as_ref()).await)
        }
    });
    let io = TokioIo::new(tls);
    if h2 {
        let mut builder = hyper::server::conn::http2::Builder::new(TokioExecutor::new());
        builder
            .timer(TokioTimer::new())
            .max_concurrent_streams(MAX_STREAMS_PER_CONNECTION)
            .max_header_list_size(u32::try_from(MAX_HEAD).unwrap_or(u32::MAX))
            .keep_alive_interval(Duration::from_secs(30))
            .keep_alive_timeout(HANDSHAKE_TIMEOUT);
        let conn = builder.serve_connection(io, service);
        tokio::pin!(conn);
        tokio::select! {
            _ = conn.as_mut() => return,
            () = stopped(&mut stop) => conn.as_mut().graceful_shutdown(),
        }
        let _ = conn.await;
    } else {
        let mut builder = hyper::server::conn::http1::Builder::new();
        builder
            .timer(TokioTimer::new())
            .header_read_timeout(HANDSHAKE_TIMEOUT)
            .max_buf_size(MAX_HEAD.max(8192))
            .keep_alive(true);
        let conn = builder.serve_connection(io, service);
        tokio::pin!(conn);
        tokio::select! {
            _ = conn.as_mut() => return,
            () = stopped(&mut stop) => conn.as_mut().graceful_shutdown(),
        }
        let _ = conn.await;
    }
}
