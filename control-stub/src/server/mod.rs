//! `control-stub serve`'s process: a few components, each built, started
//! and stopped by [`run`] in a fixed order, by explicit calls (nothing
//! waits on which value is dropped last).
//!
//! | component | what it holds |
//! |---|---|
//! | metrics endpoint (`metrics`) | the Prometheus recorder and `--metrics-listen`'s listener |
//! | upkeep loops (`upkeep`) | one thread per member (descriptions, leases, forwarding tables) and the tick (closes owed, time-driven events, certificates), each with its store connection and control channel client |
//! | batch intake ([`intake`]) | the `ControlPlane` service: batches verified and recorded, the relay's proposals; the store work under way |
//! | control listener ([`control`]) | the gateways' listener: mutual TLS, HTTP/2, the intake's routes |
//! | people listener (`people`) | the listener people reach: the people's web app (`--web-listen`: passkeys, cards, sessions, Revoke All; its store connections, Web Push and card watch) with the link that delivers decisions |
//!
//! Beside them: [`settings`] (what `serve` was given), [`listener`] (a
//! bound listener, its accept loop and its connections, as each of the
//! three listeners runs them) and [`signals`].
//!
//! `run` goes through these phases:
//!
//! 1. [`Prepared::new`]: everything that can fail, done (the identity and
//!    its TLS configs, the store opened and its members merged with
//!    `--gateway`, a live session on a member with no address refused,
//!    the plane's and the relay's keys read, the metrics recorder
//!    installed, every listener bound, every signal handler installed);
//!    a failure is an [`Error`] naming what failed, and nothing has run.
//! 2. [`Prepared::start`] prints one ready line on standard output
//!    (`{"listening": ADDR, …}`, with every bound address, useful with
//!    port 0), then starts the components in this order: the metrics
//!    endpoint (so everything after it can be watched), the upkeep loops,
//!    the people's web app opened (its store connections, Web Push, the
//!    card watch: the batch intake calls its card hook for each new card),
//!    the control listener serving the batch intake, the people listener
//!    accepting; then the signals are handled (a signal that came since
//!    they were installed is handled then).
//! 3. [`Running::serve`] waits for SIGTERM, SIGINT or SIGQUIT.
//! 4. [`Running::drain`] stops them in reverse, in numbered steps, each
//!    an explicit call that logs one line on standard error
//!    (`{"drain": N, "part": …}`):
//!    1. the people listener closes (no new connection) and tells its
//!       connections to finish: the grace (`--grace-ms`) runs from here;
//!    2. the control listener closes and sends every gateway's
//!       connection GOAWAY: no batch or proposal is taken on a new
//!       connection from here;
//!    3. the people listener's connections get the grace, the rest are
//!       cut; the decisions under way (store calls) are waited for, and
//!       its link to the gateways let go;
//!    4. the control listener's calls under way get the grace, the rest
//!       are cut (a gateway whose connection is cut before the answer
//!       sends the batch again later);
//!    5. the batch intake takes no more and waits for every batch and
//!       proposal taken to be committed or rolled back (never cut: an
//!       acknowledged batch is on disk, and one taken whose answer was
//!       lost is answered `DUPLICATE` when sent again);
//!    6. the upkeep loops are told to stop, each ends its round, their
//!       threads are joined;
//!    7. the metrics endpoint closes (a scrape under way gets
//!       [`SCRAPE_GRACE`]);
//!    8. the signals' handlers end, and the process exits (`"stopped"`).

pub mod control;
pub mod intake;
pub mod listener;
mod metrics;
mod people;
pub mod settings;
pub mod signals;
mod upkeep;

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::error::Error;
use crate::grpc_link::{merge_targets, override_ids};
use crate::identity::Identity;
use crate::store::Store;

use control::ControlListener;
use intake::Intake;
use metrics::Metrics;
use people::People;
pub use settings::{Settings, DEFAULT_GRACE};
use signals::{Handled, Signals};
use upkeep::UpkeepLoops;

/// How long a scrape of the metrics endpoint under way at the drain's
/// last step gets: Prometheus reads the whole text in milliseconds.
pub const SCRAPE_GRACE: Duration = Duration::from_secs(1);

/// Run `serve` with `settings` until a shutdown signal, then drain; the
/// ready line goes to `stdout`.
pub fn run(settings: Settings, stdout: &mut dyn Write) -> Result<(), Error> {
    settings.check()?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| Error::Io {
            what: "runtime".into(),
            reason: e.to_string(),
        })?;
    let prepared = Prepared::new(settings, &runtime)?;
    let running = runtime.block_on(prepared.start(stdout))?;
    runtime.block_on(async {
        let running = running.serve().await;
        running.drain().await;
    });
    // Every part has stopped and waited for its own work: nothing is left
    // on the runtime to wait for (its idle threads end here).
    runtime.shutdown_timeout(Duration::ZERO);
    Ok(())
}

/// Everything that can fail at start, done: nothing runs yet.
#[derive(Debug)]
pub struct Prepared {
    settings: Settings,
    metrics: Option<Metrics>,
    upkeep: UpkeepLoops,
    control: ControlListener,
    people: People,
    signals: Signals,
}

impl Prepared {
    /// Build everything, in this order: the identity and its TLS config;
    /// the store, the members it reaches (the store's merged with
    /// `--gateway`), refused if a live session is held on a member with no
    /// address; the plane's key (so a bad key file stops the start, not
    /// the first certificate); the metrics recorder; then, in `runtime`'s
    /// context, the listeners bound (metrics, control, people: the relay's
    /// key and the link that delivers decisions with them) and the signal
    /// handlers installed.
    pub fn new(settings: Settings, runtime: &tokio::runtime::Runtime) -> Result<Prepared, Error> {
        let dir = settings.control_dir.clone();
        let identity = Identity::load(&dir, "stub")?;
        let tls = identity.server_config()?;
        let opened = Store::open(&settings.db)?;
        let targets = merge_targets(&opened.members()?, &settings.gateways);
        refuse_unaddressed(&opened, &settings.gateways)?;
        crate::identity::plane_key(&dir)?;
        let store = Arc::new(Mutex::new(opened));
        let _context = runtime.enter();
        let metrics = Metrics::prepare(&settings, &store)?;
        let intake = Intake::shared(Arc::clone(&store)).registering(dir);
        let control = ControlListener::new(listener::bind(settings.listen)?, tls, intake)?;
        let people = People::prepare(&settings)?;
        let upkeep = UpkeepLoops::new(&settings, &targets);
        // Before the ready line (see `signals`).
        let signals = Signals::listen();
        Ok(Prepared {
            settings,
            metrics,
            upkeep,
            control,
            people,
            signals,
        })
    }

    /// Print the ready line, then start every component in order
    /// (metrics, upkeep loops, control listener with the intake, people
    /// listener) and handle the signals. The line comes first so that a
    /// standard output that cannot be written stops the start with
    /// nothing running; every listener is bound, so a client that
    /// connects as soon as it reads the line waits in the listen queue for
    /// the instant it takes to start.
    pub async fn start(self, stdout: &mut dyn Write) -> Result<Running, Error> {
        let mut ready = serde_json::json!({
            "listening": self.control.addr().to_string(),
            "service": "talos.control.v1.ControlPlane",
        });
        self.people.ready(&mut ready);
        if let Some(m) = &self.metrics {
            m.ready(&mut ready);
        }
        writeln!(stdout, "{ready}")
            .and_then(|()| stdout.flush())
            .map_err(|e| Error::Io {
                what: "standard output".into(),
                reason: e.to_string(),
            })?;
        if let Some(m) = &self.metrics {
            m.start();
        }
        // Threads of their own, which block on runtimes of their own:
        // started (and, on a failure, stopped again) off this one's
        // threads.
        let upkeep = self.upkeep;
        let upkeep = tokio::task::spawn_blocking(move || upkeep.start().map(|()| upkeep))
            .await
            .map_err(|e| Error::Io {
                what: "upkeep loops".into(),
                reason: e.to_string(),
            })??;
        let mut people = self.people;
        let mut control = self.control;
        if let Some(hook) = people.open().await? {
            control.on_card(hook);
        }
        control.start();
        people.start();
        Ok(Running {
            grace: self.settings.grace,
            metrics: self.metrics,
            upkeep,
            control,
            people,
            signals: self.signals.handle(),
        })
    }
}

/// A live session on a member this process could not reach would lose its
/// renewals and its closes: refuse to start, naming the member.
fn refuse_unaddressed(store: &Store, gateways: &[String]) -> Result<(), Error> {
    let unaddressed = store.unaddressed(&override_ids(gateways))?;
    if unaddressed.is_empty() {
        return Ok(());
    }
    let named: Vec<String> = unaddressed
        .iter()
        .map(|u| {
            format!(
                "{} ({} live sessions: {})",
                u.gateway_id,
                u.session_count,
                u.sessions.join(", ")
            )
        })
        .collect();
    Err(Error::GatewayUnaddressed(format!(
        "live sessions are held on members with no control address: {}; give each one: control-stub gateway add ID --control HOST:PORT",
        named.join("; ")
    )))
}

/// `serve` at work: every component, started.
#[derive(Debug)]
pub struct Running {
    grace: Duration,
    metrics: Option<Metrics>,
    upkeep: UpkeepLoops,
    control: ControlListener,
    people: People,
    signals: Handled,
}

impl Running {
    /// Serve until SIGTERM, SIGINT or SIGQUIT.
    pub async fn serve(self) -> Running {
        self.signals.shutdown.clone().wait().await;
        self
    }

    /// Stop every component in reverse, one numbered step each (see the
    /// module's docs), each logged.
    pub async fn drain(self) {
        let deadline = tokio::time::Instant::now() + self.grace;
        // 1. The people listener: closed, its connections told.
        let open = self.people.close(self.grace).await;
        step(
            1,
            "people listener",
            serde_json::json!({"closed": self.people.names(), "open": open, "grace_ms": self.grace.as_millis()}),
        );
        // 2. The control listener: closed, GOAWAY to every gateway.
        let open = self.control.close().await;
        step(
            2,
            "control listener",
            serde_json::json!({"closed": true, "open": open}),
        );
        // 3. The people's connections finished or cut; their calls
        //    waited for; the link let go.
        let people = self.people.stop(deadline).await;
        step(3, "people listener", serde_json::json!({"stopped": people}));
        // 4. The gateways' calls finished or cut.
        let control = self.control.finish(deadline).await;
        step(
            4,
            "control listener",
            serde_json::json!({"stopped": control}),
        );
        // 5. Every batch and proposal taken, decided.
        let decided = self.control.intake().stop().await;
        step(
            5,
            "batch intake",
            serde_json::json!({"stopped": true, "under_way": decided}),
        );
        // 6. The upkeep loops, each at the end of its round.
        let upkeep = self.upkeep;
        let loops = tokio::task::spawn_blocking(move || upkeep.stop())
            .await
            .unwrap_or(0);
        step(6, "upkeep loops", serde_json::json!({"stopped": loops}));
        // 7. The metrics endpoint.
        let metrics = match self.metrics {
            Some(m) => Some(m.stop(tokio::time::Instant::now() + SCRAPE_GRACE).await),
            None => None,
        };
        step(
            7,
            "metrics endpoint",
            serde_json::json!({"stopped": metrics}),
        );
        // 8. The signals; the process exits.
        self.signals.stop().await;
        step(8, "signals", serde_json::json!({"stopped": true}));
        eprintln!("{}", serde_json::json!({"stopped": true}));
    }
}

/// One line of the drain on standard error: its number, the part, what
/// was done.
fn step(n: u32, part: &str, mut what: serde_json::Value) {
    what["drain"] = n.into();
    what["part"] = part.into();
    eprintln!("{what}");
}
