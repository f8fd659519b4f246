//! The upkeep loops: what `serve` does while nobody types a command
//! ([`crate::upkeep`] says what each round does), each loop on a thread of
//! its own with its own store connection and control channel client (the
//! link blocks on its own runtime): one for closes owed, time-driven
//! events and certificates, every `--tick-ms`; one per member for its
//! leases, every `--renew-ms`, so a member that hangs never delays
//! another's renewals.
//!
//! The members are the store's (`gateway add`) and `--gateway`'s: the tick
//! reads the store's again every round, starts the loop of a member added
//! since and ends the loop of one removed, so a change needs no restart of
//! `serve`.
//!
//! [`UpkeepLoops::stop`] wakes every loop at once; each ends the round it
//! is in (a call to a member bounded by the link's timeouts, a store
//! transaction by the store's) and its thread is joined.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use talos_contract::sync::Locked;

use super::settings::Settings;
use crate::error::Error;
use crate::grpc_link::{merge_targets, override_ids, GatewayAddr, GrpcLink};
use crate::store::{Db, Store};

/// The upkeep loops: built, then started, then stopped.
#[derive(Debug)]
pub struct UpkeepLoops {
    shared: Arc<Upkeeps>,
    /// The members reached at start.
    first: Vec<String>,
}

impl UpkeepLoops {
    /// The loops `settings` asks for, over the members `targets`; nothing
    /// runs yet.
    pub fn new(settings: &Settings, targets: &[String]) -> UpkeepLoops {
        UpkeepLoops {
            shared: Arc::new(Upkeeps {
                db: settings.db.clone(),
                control_dir: settings.control_dir.clone(),
                renew: settings.renew,
                tick: settings.tick,
                stopped: Arc::new(Stop::default()),
                overrides: settings.gateways.clone(),
                targets: Mutex::new(Vec::new()),
                threads: Mutex::new(Vec::new()),
            }),
            first: targets.to_vec(),
        }
    }

    /// Start every loop: one per member reached now, and the tick. On a
    /// failure (a thread that cannot be made), the loops started are
    /// stopped again.
    pub fn start(&self) -> Result<(), Error> {
        let started = self.shared.sync(&self.first).and_then(|()| {
            let u = Arc::clone(&self.shared);
            self.shared.spawn("upkeep".into(), move || u.tick_loop())
        });
        if started.is_err() {
            self.stop();
        }
        started
    }

    /// Wake every loop and wait for each to end its round (blocking: call
    /// it off the serving runtime's threads); how many loops there were.
    pub fn stop(&self) -> usize {
        self.shared.stopped.stop();
        self.shared.join()
    }
}

/// What the upkeep loops share: where the store and the identity are,
/// the loops' settings, the members reached now and every loop's thread.
#[derive(Debug)]
struct Upkeeps {
    db: Db,
    control_dir: PathBuf,
    renew: Duration,
    tick: Duration,
    stopped: Arc<Stop>,
    /// `--gateway`, which the store's members are merged with.
    overrides: Vec<String>,
    /// The members reached now (`ID=ADDR`, as `GrpcLink` takes them), each
    /// with a renewal loop of its own.
    targets: Mutex<Vec<String>>,
    threads: Mutex<Vec<std::thread::JoinHandle<()>>>,
}

impl Upkeeps {
    fn spawn(&self, name: String, f: impl FnOnce() + Send + 'static) -> Result<(), Error> {
        let t = std::thread::Builder::new()
            .name(name.clone())
            .spawn(f)
            .map_err(|e| Error::Io {
                what: format!("{name} thread"),
                reason: e.to_string(),
            })?;
        self.threads.locked().push(t);
        Ok(())
    }

    /// Make `targets` the members reached: a renewal loop started for
    /// each new one (a loop whose member is gone ends by itself).
    fn sync(self: &Arc<Self>, targets: &[String]) -> Result<(), Error> {
        let added: Vec<String> = {
            let mut now = self.targets.locked();
            let added = targets
                .iter()
                .filter(|t| !now.contains(t))
                .cloned()
                .collect();
            let removed: Vec<&String> = now.iter().filter(|t| !targets.contains(t)).collect();
            for r in removed {
                eprintln!(
                    "{}",
                    serde_json::json!({"member_dropped": r, "action": "its leases are no longer renewed from here"})
                );
            }
            *now = targets.to_vec();
            added
        };
        for target in added {
            let u = Arc::clone(self);
            let label = GatewayAddr::parse(&target).label();
            self.spawn(format!("renew-{label}"), move || u.renew_loop(&target))?;
        }
        Ok(())
    }

    fn reached(&self, target: &str) -> bool {
        self.targets.locked().iter().any(|t| t == target)
    }

    /// The members to reach now: the store's, merged with `--gateway`.
    fn current(&self, store: &Store) -> Result<Vec<String>, Error> {
        Ok(merge_targets(&store.members()?, &self.overrides))
    }

    /// One member's renewals, every `--renew-ms`, until serving ends or
    /// the member is no longer reached.
    fn renew_loop(&self, target: &str) {
        let Some(mut r) = Round::open(self, &[target.to_owned()]) else {
            return;
        };
        loop {
            let started = Instant::now();
            if !self.reached(target) {
                return;
            }
            r.run(true);
            if self
                .stopped
                .wait(self.renew.saturating_sub(started.elapsed()))
            {
                return;
            }
        }
    }

    /// Closes, time-driven events and certificates, every `--tick-ms`;
    /// and the members: added and removed ones followed, and a live
    /// session on a member nobody here can reach said.
    fn tick_loop(self: Arc<Self>) {
        let targets = self.targets.locked().clone();
        let Some(mut r) = Round::open(&self, &targets) else {
            return;
        };
        let mut unaddressed_before: Vec<String> = Vec::new();
        loop {
            let started = Instant::now();
            match self.current(&r.store) {
                Ok(now) if now != r.targets => {
                    if let Err(e) = self.sync(&now) {
                        fail("members", &e);
                    }
                    match GrpcLink::new(&now, Some(self.control_dir.clone())) {
                        Ok(link) => {
                            r.link = link;
                            r.targets = now;
                        }
                        Err(e) => fail("link", &e),
                    }
                }
                Ok(_) => {}
                Err(e) => fail("members", &e),
            }
            r.run(false);
            // A live session on a member nobody here can reach (it has no
            // address in the store nor on the command line): its leases
            // lapse and its closes wait.
            match r.store.unaddressed(&override_ids(&r.targets)) {
                Ok(unaddressed) => {
                    metrics::gauge!("stub_members_unaddressed").set(unaddressed.len() as f64);
                    let ids: Vec<String> =
                        unaddressed.iter().map(|u| u.gateway_id.clone()).collect();
                    if ids != unaddressed_before {
                        for u in &unaddressed {
                            eprintln!(
                                "{}",
                                serde_json::json!({"member_unaddressed": u.gateway_id, "live_sessions": u.session_count, "sessions": u.sessions, "action": "its leases are not renewed and its closes not asked: control-stub gateway add ID --control HOST:PORT"})
                            );
                        }
                        unaddressed_before = ids;
                    }
                }
                Err(e) => fail("members", &e),
            }
            if self
                .stopped
                .wait(self.tick.saturating_sub(started.elapsed()))
            {
                return;
            }
        }
    }

    /// Wait for every loop (after `stopped`); how many there were.
    fn join(&self) -> usize {
        let mut joined = 0;
        loop {
            let next = self.threads.locked().pop();
            match next {
                Some(t) => {
                    let _ = t.join();
                    joined += 1;
                }
                None => return joined,
            }
        }
    }
}

/// An upkeep loop's failure, logged; the next round tries again.
fn fail(what: &str, e: &dyn std::fmt::Display) {
    eprintln!(
        "{}",
        serde_json::json!({"upkeep": "failed", "what": what, "error": e.to_string()})
    );
}

/// What one upkeep loop runs its rounds with.
struct Round {
    store: Store,
    link: GrpcLink,
    targets: Vec<String>,
    plane_key: talos_certs::GatewayKey,
    relay: Option<talos_certs::GatewayKey>,
    /// Whether the last renewal round reached the member: the first that
    /// does, after the start or a failure, is logged (`{"renewing": …}`).
    renewing: bool,
}

impl Round {
    fn open(u: &Upkeeps, targets: &[String]) -> Option<Round> {
        let store = Store::open(&u.db).map_err(|e| fail("store", &e)).ok()?;
        let link = GrpcLink::new(targets, Some(u.control_dir.clone()))
            .map_err(|e| fail("link", &e))
            .ok()?;
        let plane_key = crate::identity::plane_key(&u.control_dir)
            .map_err(|e| fail("plane key", &e))
            .ok()?;
        let relay = crate::identity::relay_key(&u.control_dir).ok();
        Some(Round {
            store,
            link,
            targets: targets.to_vec(),
            plane_key,
            relay,
            renewing: false,
        })
    }

    /// One round: with `renewer`, describe and renew the member; else the
    /// tick. What it did is logged when it did something.
    fn run(&mut self, renewer: bool) {
        let verifier = crate::confirm::SignatureVerifier;
        let mut upkeep = crate::upkeep::Upkeep {
            store: &mut self.store,
            link: &self.link,
            verifier: &verifier,
            plane_key: Some(&self.plane_key),
            relay_key: self.relay.as_ref(),
        };
        let round = if renewer {
            upkeep.keep_members()
        } else {
            upkeep.tick(std::time::SystemTime::now(), false)
        };
        let reached = matches!(&round, Ok(r) if r.members_down.is_empty());
        if renewer && reached && !self.renewing {
            eprintln!("{}", serde_json::json!({"renewing": self.targets}));
        }
        if renewer {
            self.renewing = reached;
        }
        match round {
            Ok(report) => {
                if !report.events.is_empty()
                    || !report.issued.is_empty()
                    || report.closes_confirmed > 0
                    || !report.members_down.is_empty()
                {
                    eprintln!("{}", serde_json::json!({"upkeep": report}));
                }
            }
            Err(e) => fail(if renewer { "renew" } else { "tick" }, &e),
        }
    }
}

/// Tells the upkeep loops that serving has ended, waking each at once.
#[derive(Debug, Default)]
struct Stop {
    stopped: Mutex<bool>,
    wake: std::sync::Condvar,
}

impl Stop {
    fn stop(&self) {
        *self.stopped.locked() = true;
        self.wake.notify_all();
    }

    /// Wait up to `span`; whether serving has ended.
    fn wait(&self, span: Duration) -> bool {
        let guard = self.stopped.locked();
        let (stopped, _) = self
            .wake
            .wait_timeout_while(guard, span, |stopped| !*stopped)
            .unwrap_or_else(|p| p.into_inner());
        *stopped
    }
}
