//! Reload: the config read again, and everything it sets built before
//! anything changes; then applied at once, or not at all.
//!
//! A reload (SIGHUP, or `gateway reload`) goes in two steps:
//!
//! 1. **Build.** The file is read and validated as at start; a field only
//!    a restart changes ([`Config::restart_only`]) must be as running; the
//!    trust anchors are read, the resolver made, the log filter parsed,
//!    the static sessions' secrets read and, for each static session that
//!    is new or changed, a fresh CA made and its trust file written beside
//!    its place (`.tmp`). Any failure here ends the reload: the error
//!    names the file, the line and the field, the `.tmp` files go, and
//!    nothing running has changed.
//! 2. **Apply**, which cannot fail: the trust files are renamed into
//!    place; new connections get the new limits, resolver and upstream
//!    settings; every session's pool and share take the new settings and
//!    bounds; the connection cap and the lease length change; static
//!    sessions are opened, replaced (the old authority is ended, its
//!    connections cut) or closed; the log filter changes. Connections
//!    open at the reload keep going as they were.
//!
//! One reload runs at a time, and never during a handover.

use std::collections::{BTreeSet, HashMap};
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Semaphore;

use crate::authority::Authority;
use crate::config::{Config, ConfigError};
use crate::gate::resolve::Resolver;
use crate::refusal::causes;
use crate::secrets::secret::SecretBytes;
use crate::serving::{Context, InForce};
use crate::session::lease::{Lease, SharedClock};
use crate::session::sessions::{Session, Sessions, UpstreamSettings};
use talos_contract::sync::Locked;

/// What a config sets that a reload can change, built.
#[derive(Debug)]
pub struct Tuned {
    pub upstream: UpstreamSettings,
    pub resolver: Resolver,
    pub hello_max_bytes: usize,
    pub hello_timeout: Duration,
    pub handshake_timeout: Duration,
    pub h2_idle_timeout: Duration,
    pub tcp_keepalive: Duration,
    pub max_connections: usize,
    pub grace: Duration,
    pub lease: Option<Duration>,
    pub log: String,
}

causes! {
    /// How a reload ended (the `result` of `gateway_reload_total`).
    pub enum ReloadResult {
        /// The new config is in force.
        Ok => "ok",
        /// The new config was refused; the previous one still runs.
        Refused => "refused",
    }
}

/// Why a reload changed nothing.
#[derive(Debug, thiserror::Error)]
pub enum ReloadError {
    #[error("{0}")]
    Config(#[from] ConfigError),
    #[error("{0}")]
    Build(String),
    #[error("a handover is in progress; reload after it")]
    Busy,
    /// This process has handed over to a successor and only drains: the
    /// successor runs the config now.
    #[error("this process has handed over to its successor and is draining; reload the successor")]
    HandedOver,
    /// `gateway reload --config` named a file this process does not run
    /// with: applying it would leave a later SIGHUP (or a successor)
    /// reading the running file again.
    #[error(
        "{asked} is not this gateway's config file ({running}): a reload reads the file the gateway runs with; edit that one, or start a gateway with the other"
    )]
    OtherFile { asked: String, running: String },
}

impl Tuned {
    /// Build what `config` sets: the trust anchors read, the resolver made.
    pub fn build(config: &Config) -> Result<Tuned, String> {
        let mut anchors = Vec::new();
        for path in &config.upstream.extra_trust_anchors {
            anchors.extend(crate::config::read_pem_certs(path.get_ref())?);
        }
        let l = &config.limits;
        Ok(Tuned {
            upstream: UpstreamSettings::new(
                crate::tls::client_config(&anchors),
                *config.upstream.port.get_ref(),
                config.upstream.connect_timeout(),
                crate::session::share::Limits::from(l),
            ),
            resolver: Resolver::new(&config.resolver.settings())?,
            hello_max_bytes: *l.hello_max_bytes.get_ref(),
            hello_timeout: l.hello_timeout(),
            handshake_timeout: l.handshake_timeout(),
            h2_idle_timeout: l.h2_idle_timeout(),
            tcp_keepalive: l.tcp_keepalive(),
            max_connections: *l.max_connections.get_ref(),
            grace: l.shutdown_grace(),
            lease: config.control.as_ref().map(crate::config::Control::lease),
            log: config.log.directives().to_owned(),
        })
    }
}

/// A part of the process a reload changes: handed the one [`Tuned`] a
/// reload built, once everything is built (applying cannot fail).
pub trait Tunable: std::fmt::Debug + Send + Sync {
    fn apply(&self, tuned: &Tuned);
}

/// The connection cap (`limits.max_connections`).
impl Tunable for Cap {
    fn apply(&self, tuned: &Tuned) {
        self.resize(tuned.max_connections);
    }
}

/// The drain grace, in milliseconds.
#[derive(Debug)]
pub struct Grace(pub Arc<AtomicU64>);

impl Tunable for Grace {
    fn apply(&self, tuned: &Tuned) {
        self.0.store(
            u64::try_from(tuned.grace.as_millis()).unwrap_or(u64::MAX),
            Ordering::Relaxed,
        );
    }
}

/// Every open session's pool and share.
impl Tunable for Sessions {
    fn apply(&self, tuned: &Tuned) {
        for s in self.all() {
            s.retune(&tuned.upstream);
        }
    }
}

/// The length of the leases the control plane's authorities get.
impl Tunable for Authority {
    fn apply(&self, tuned: &Tuned) {
        if let Some(lease) = tuned.lease {
            self.set_lease_length(lease);
        }
    }
}

/// The log filter (checked when the reload was built).
impl Tunable for crate::logging::LogControl {
    fn apply(&self, tuned: &Tuned) {
        if let Ok(filter) = crate::logging::LogControl::check(&tuned.log) {
            self.set(filter);
        }
    }
}

impl Context {
    /// What every connection shares, with `tuned`'s settings.
    pub fn new(
        gateway_id: Arc<str>,
        sessions: Arc<Sessions>,
        records: crate::records::journal::RecordSink,
        shutdown: crate::serving::Shutdown,
        proposer: Option<crate::session::approvals::Proposer>,
        link: Option<Arc<crate::member_link::link::Link>>,
        tuned: Tuned,
    ) -> Context {
        Context {
            gateway_id,
            sessions,
            resolver: tuned.resolver,
            records,
            upstream: tuned.upstream,
            hello_max_bytes: tuned.hello_max_bytes,
            hello_timeout: tuned.hello_timeout,
            handshake_timeout: tuned.handshake_timeout,
            h2_idle_timeout: tuned.h2_idle_timeout,
            tcp_keepalive: tuned.tcp_keepalive,
            shutdown,
            proposer,
            link,
        }
    }

    /// This with `tuned`'s settings: what new connections get after a
    /// reload (the sessions, the record writer and the rest are the same).
    pub fn retuned(&self, tuned: Tuned) -> Context {
        Context::new(
            Arc::clone(&self.gateway_id),
            Arc::clone(&self.sessions),
            self.records.clone(),
            self.shutdown.clone(),
            self.proposer.clone(),
            self.link.clone(),
            tuned,
        )
    }
}

/// The connection cap (`limits.max_connections`), resizable.
#[derive(Debug)]
pub struct Cap {
    permits: Arc<Semaphore>,
    size: Mutex<usize>,
}

impl Cap {
    pub fn new(size: usize) -> Cap {
        Cap {
            permits: Arc::new(Semaphore::new(size)),
            size: Mutex::new(size),
        }
    }

    /// The semaphore each connection holds a permit of.
    pub fn permits(&self) -> &Arc<Semaphore> {
        &self.permits
    }

    /// Make the cap `size`: more room at once; less as connections close
    /// (a task takes the permits given up as they come back).
    pub fn resize(&self, size: usize) {
        let mut current = self.size.locked();
        if size > *current {
            self.permits.add_permits(size - *current);
        } else if size < *current {
            let fewer = u32::try_from(*current - size).unwrap_or(u32::MAX);
            let permits = Arc::clone(&self.permits);
            tokio::spawn(async move {
                if let Ok(p) = permits.acquire_many_owned(fewer).await {
                    p.forget();
                }
            });
        }
        *current = size;
    }
}

/// A static session as the config defines it, secrets aside: what tells a
/// changed one from an unchanged one.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct StaticEntry {
    pub tenant: String,
    pub attempt: u32,
    pub sources: BTreeSet<IpAddr>,
    pub allowlist: BTreeSet<String>,
    pub attach: BTreeSet<String>,
    pub trust_file: Option<PathBuf>,
    /// Absent from an older process's handover: none then.
    #[serde(default)]
    pub passthrough: BTreeSet<String>,
}

impl StaticEntry {
    fn of(s: &crate::config::StaticSession) -> StaticEntry {
        StaticEntry {
            tenant: s.tenant.clone(),
            attempt: s.attempt,
            sources: s
                .sources
                .get_ref()
                .iter()
                .map(|a| talos_contract::source::canonical_ip(*a.get_ref()))
                .collect(),
            allowlist: s
                .allowlist
                .iter()
                .map(|n| n.get_ref().as_str().to_owned())
                .collect(),
            attach: s.attach.iter().map(|a| a.get_ref().clone()).collect(),
            trust_file: s.trust_file.clone(),
            passthrough: s
                .passthrough
                .iter()
                .map(|n| n.get_ref().as_str().to_owned())
                .collect(),
        }
    }
}

/// The static sessions open now, by id, as the config defined them.
pub type StaticSet = HashMap<String, StaticEntry>;

/// Whether `session`'s attached values are `values`' for its secrets.
fn same_values(session: &Session, values: &HashMap<String, SecretBytes>) -> bool {
    session.attachments.iter().all(|a| {
        values
            .get(&a.secret)
            .is_some_and(|v| v.expose() == a.value.expose())
    })
}

/// A static session to open: the session, its definition, and its trust
/// file's `.tmp` (written) and place.
type Opening = (Arc<Session>, StaticEntry, Option<(PathBuf, PathBuf)>);

/// What the static sessions of a config change, built.
#[derive(Debug, Default)]
pub struct StaticPlan {
    /// New or changed: the session, its sources, its trust file's `.tmp`
    /// (written) and place.
    open: Vec<Opening>,
    /// Ids no longer in the config.
    close: Vec<String>,
    /// Ids unchanged.
    pub kept: usize,
}

impl StaticPlan {
    /// How many sessions it opens (new or replaced) and closes.
    pub fn counts(&self) -> (usize, usize) {
        (self.open.len(), self.close.len())
    }

    /// Remove the `.tmp` trust files written (a reload that fails later).
    pub fn abandon(self) {
        for (_, _, file) in self.open {
            if let Some((tmp, _)) = file {
                let _ = std::fs::remove_file(tmp);
            }
        }
    }
}

/// Build the static sessions of `config` against what is open (`open`, in
/// `sessions`): unchanged ones are kept, new or changed ones get a fresh
/// CA and their trust file written to `.tmp`, missing ones are closed.
pub fn plan_static(
    config: &Config,
    open: &StaticSet,
    sessions: &Sessions,
    upstream: &UpstreamSettings,
    clock: &SharedClock,
) -> Result<StaticPlan, String> {
    let values = config.secret_values().map_err(|e| e.to_string())?;
    let mut plan = StaticPlan::default();
    let result = (|| {
        for s in &config.sessions {
            let id = s.id.get_ref();
            let entry = StaticEntry::of(s);
            let unchanged = open.get(id) == Some(&entry)
                && sessions
                    .find(id)
                    .is_some_and(|held| !held.lease.is_leased() && same_values(&held, &values));
            if unchanged {
                plan.kept += 1;
                continue;
            }
            let spec = crate::session::sessions::SessionSpec::from_static(s, &values)
                .map_err(|e| e.to_string())?;
            let session = Session::open(
                spec,
                config.gateway_id.get_ref(),
                upstream,
                None,
                Lease::none(Arc::clone(clock)),
            )
            .map_err(|e| format!("cannot open session {id}: {e}"))?;
            let file = match &s.trust_file {
                Some(path) => {
                    let tmp = tmp_path(path);
                    std::fs::write(&tmp, session.ca_pem()).map_err(|e| {
                        format!(
                            "cannot write the trust file of session {id} to {}: {e}",
                            tmp.display()
                        )
                    })?;
                    Some((tmp, path.clone()))
                }
                None => None,
            };
            plan.open.push((Arc::new(session), entry, file));
        }
        for id in open.keys() {
            if !config.sessions.iter().any(|s| s.id.get_ref() == id) {
                plan.close.push(id.clone());
            }
        }
        Ok(())
    })();
    match result {
        Ok(()) => Ok(plan),
        Err(e) => {
            plan.abandon();
            Err(e)
        }
    }
}

fn tmp_path(path: &Path) -> PathBuf {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    PathBuf::from(tmp)
}

/// Apply a plan: trust files into place, sessions opened, replaced and
/// closed (an authority a static session displaces is ended: with its
/// report when the control plane opened it).
pub fn apply_static(
    plan: StaticPlan,
    open: &mut StaticSet,
    sessions: &Sessions,
    authority: Option<&Arc<Authority>>,
) {
    for (session, entry, file) in plan.open {
        if let Some((tmp, path)) = file {
            if let Err(e) = std::fs::rename(&tmp, &path) {
                tracing::error!(session = %session.id, path = %path.display(), error = %e, "cannot put the trust file in place");
            }
        }
        tracing::info!(
            session = %session.id,
            attempt = session.attempt,
            ca_digest = session.ca_digest(),
            attachments = session.attachments.len(),
            "session CA made"
        );
        let sources: Vec<IpAddr> = entry.sources.iter().copied().collect();
        for old in sessions.replace(&sources, Arc::clone(&session)) {
            end(old, authority);
        }
        open.insert(session.id.to_string(), entry);
    }
    for id in plan.close {
        open.remove(&id);
        if let Some(s) = sessions.find(&id).filter(|s| !s.lease.is_leased()) {
            if let Ok(s) = sessions.remove(&id, s.attempt) {
                tracing::info!(session = %id, "session no longer in the config: closed");
                end(s, authority);
            }
        }
    }
}

fn end(session: Arc<Session>, authority: Option<&Arc<Authority>>) {
    match authority {
        Some(a) if session.lease.is_leased() => {
            a.end_in_background(session, talos_certs::DropReason::Replaced);
        }
        _ => {
            session.end_and_withdraw();
        }
    }
}

/// Reloads the running process's config.
#[derive(Debug)]
pub struct Reloader {
    path: PathBuf,
    current: Arc<InForce>,
    /// What a reload changes besides the settings new connections get.
    tunables: Vec<Arc<dyn Tunable>>,
    authority: Option<Arc<Authority>>,
    clock: SharedClock,
    /// What the admin listener shows of the config in force.
    in_force: Arc<ConfigInForce>,
    state: tokio::sync::Mutex<State>,
}

#[derive(Debug)]
struct State {
    restart_only: Vec<(&'static str, String)>,
    digest: String,
    statics: StaticSet,
    /// A successor took over: this process reloads nothing again.
    handed_over: bool,
}

/// Reloads wait while this lives (a handover in progress). Dropped, the
/// handover failed and reloads go on; [`Paused::hand_over`]: it succeeded,
/// and reloads are refused from then on.
#[derive(Debug)]
pub struct Paused<'a>(tokio::sync::MutexGuard<'a, State>);

impl Paused<'_> {
    /// The successor took over: every later reload (or upgrade) of this
    /// process is refused ([`ReloadError::HandedOver`]).
    pub fn hand_over(mut self) {
        self.0.handed_over = true;
    }

    /// The static sessions open now, as the config defined them.
    pub fn statics(&self) -> &StaticSet {
        &self.0.statics
    }

    /// The running config's fields that only a restart changes.
    pub fn restart_only(&self) -> &[(&'static str, String)] {
        &self.0.restart_only
    }
}

/// What a reload did.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Reloaded {
    pub digest: String,
    pub sessions_opened: usize,
    pub sessions_closed: usize,
    pub sessions_kept: usize,
}

/// What the reloader is given at start.
#[derive(Debug)]
pub struct Reloadable {
    pub path: PathBuf,
    /// The running config's fields only a restart changes.
    pub config_restart_only: Vec<(&'static str, String)>,
    /// The running config's digest.
    pub digest: String,
    pub statics: StaticSet,
    pub current: Arc<InForce>,
    /// What a reload changes besides the settings new connections get
    /// (the cap, the grace, the sessions, the lease length, the log).
    pub tunables: Vec<Arc<dyn Tunable>>,
    pub authority: Option<Arc<Authority>>,
    pub clock: SharedClock,
    /// Where the digest of the config in force is published.
    pub in_force: Arc<ConfigInForce>,
}

impl Reloader {
    pub fn new(p: Reloadable) -> Reloader {
        let digest = p.digest;
        p.in_force.set(&digest);
        Reloader {
            in_force: p.in_force,
            path: p.path,
            current: p.current,
            tunables: p.tunables,
            authority: p.authority,
            clock: p.clock,
            state: tokio::sync::Mutex::new(State {
                restart_only: p.config_restart_only,
                digest,
                statics: p.statics,
                handed_over: false,
            }),
        }
    }

    /// The digest of the config in force.
    pub async fn digest(&self) -> String {
        self.state.lock().await.digest.clone()
    }

    /// Hold off reloads while a handover runs: [`ReloadError::Busy`] if a
    /// reload (or another handover) is running now,
    /// [`ReloadError::HandedOver`] once one has succeeded.
    pub fn pause(&self) -> Result<Paused<'_>, ReloadError> {
        let state = self.state.try_lock().map_err(|_| ReloadError::Busy)?;
        if state.handed_over {
            return Err(ReloadError::HandedOver);
        }
        Ok(Paused(state))
    }

    /// Reload the file this process runs with (SIGHUP): see the module
    /// docs. Counted in `gateway_reload_total` by result.
    pub async fn reload(&self) -> Result<Reloaded, ReloadError> {
        self.reload_asked(None).await
    }

    /// Reload as `gateway reload --config ASKED` asks: ASKED must be the
    /// file this process runs with, compared with symlinks and relative
    /// parts resolved (another file is refused, and counted so); then as
    /// [`Reloader::reload`].
    pub async fn reload_file(&self, asked: &Path) -> Result<Reloaded, ReloadError> {
        self.reload_asked(Some(asked)).await
    }

    async fn reload_asked(&self, asked: Option<&Path>) -> Result<Reloaded, ReloadError> {
        crate::process::notify::reloading();
        let result = match asked.map(|a| self.same_file(a)) {
            Some(Err(e)) => Err(e),
            _ => self.reload_inner().await,
        };
        crate::process::notify::ready();
        let outcome = if result.is_ok() {
            ReloadResult::Ok
        } else {
            ReloadResult::Refused
        };
        metrics::counter!("gateway_reload_total", "result" => outcome.as_str()).increment(1);
        match &result {
            Ok(r) => tracing::info!(
                digest = %r.digest,
                sessions_opened = r.sessions_opened,
                sessions_closed = r.sessions_closed,
                "config reloaded"
            ),
            Err(e) => tracing::error!(error = %e, "reload refused; the running config stays whole"),
        }
        result
    }

    /// Whether `asked` is this process's config file, each path resolved
    /// now (a symlink swapped since the start is followed); a path that
    /// cannot be resolved is compared as it is.
    fn same_file(&self, asked: &Path) -> Result<(), ReloadError> {
        let resolve = |p: &Path| std::fs::canonicalize(p).unwrap_or_else(|_| p.to_owned());
        let (asked, running) = (resolve(asked), resolve(&self.path));
        if asked == running {
            Ok(())
        } else {
            Err(ReloadError::OtherFile {
                asked: asked.display().to_string(),
                running: running.display().to_string(),
            })
        }
    }

    async fn reload_inner(&self) -> Result<Reloaded, ReloadError> {
        let Paused(mut state) = self.pause()?;
        let config = Config::load(&self.path)?;
        config.check_restart_only(&self.path, &state.restart_only)?;
        for w in config.warnings() {
            tracing::warn!("{}", w.0);
        }
        let tuned = Tuned::build(&config).map_err(ReloadError::Build)?;
        crate::logging::LogControl::check(&tuned.log).map_err(ReloadError::Build)?;
        let cx = self.current.get();
        let plan = plan_static(
            &config,
            &state.statics,
            &cx.sessions,
            &tuned.upstream,
            &self.clock,
        )
        .map_err(ReloadError::Build)?;
        // Everything is built: apply, which cannot fail — the one `Tuned`
        // to every part it changes, then to what new connections get.
        let (opened, closed) = plan.counts();
        let kept = plan.kept;
        for t in &self.tunables {
            t.apply(&tuned);
        }
        self.current.set(Arc::new(cx.retuned(tuned)));
        let cx = self.current.get();
        apply_static(
            plan,
            &mut state.statics,
            &cx.sessions,
            self.authority.as_ref(),
        );
        state.digest = config.digest();
        self.in_force.set(&state.digest);
        Ok(Reloaded {
            digest: state.digest.clone(),
            sessions_opened: opened,
            sessions_closed: closed,
            sessions_kept: kept,
        })
    }
}

/// The config in force, by its digest: what `/readyz` shows and
/// `gateway_config_info` says. The reloader writes it; the admin listener
/// reads it.
#[derive(Debug)]
pub struct ConfigInForce(Mutex<String>);

impl ConfigInForce {
    pub fn new(digest: String) -> ConfigInForce {
        ConfigInForce(Mutex::new(digest))
    }

    /// The digest of the config in force.
    pub fn digest(&self) -> String {
        self.0.locked().clone()
    }

    fn set(&self, digest: &str) {
        *self.0.locked() = digest.to_owned();
    }

    /// `gateway_config_info{digest}` in the Prometheus text format, appended
    /// to `/metrics`: one series, 1, for the config in force, and none for
    /// the configs it replaced.
    ///
    /// Rendered here rather than recorded through `metrics::gauge!`: neither
    /// the `metrics` facade nor `metrics-exporter-prometheus` (0.18) can drop
    /// one series. The exporter's only way to drop series is its idle
    /// timeout, which applies to every metric of a kind and would drop gauges
    /// that legitimately stay unchanged (`gateway_connections_open` on a
    /// quiet member). A series left at 0 for every digest ever loaded grows
    /// with every reload, and a query like `gateway_config_info == 1` is then
    /// needed to say which config runs.
    pub fn render_info(&self, out: &mut String) {
        use std::fmt::Write as _;
        let digest = self.digest();
        if !out.is_empty() && !out.ends_with('\n') {
            out.push('\n');
        }
        let _ = write!(
            out,
            "# HELP gateway_config_info The config in force, by the SHA-384 of its file.\n# TYPE gateway_config_info gauge\ngateway_config_info{{digest=\"{digest}\"}} 1\n"
        );
    }
}
