//! The listener people reach — approvers and operators, as opposed to
//! gateways: the people's web app (`--web-listen`,
//! [`crate::people::web`]: HTTPS, TLS 1.3 with the certificate given for
//! its public name, passkeys; `docs/people.md`).
//!
//! Built in [`People::prepare`] (the certificate and key loaded, the
//! socket bound, the relay's key and, with push, the VAPID key read);
//! opened in [`People::open`] (its store connections, Web Push and the
//! card watch: the batch intake calls its card hook, so this comes before
//! the control listener starts); accepting from [`People::start`], after
//! the control listener; at the
//! drain closed ([`People::close`]: no new connection, every connection
//! told to finish, the card streams ended) and then stopped
//! ([`People::stop`]: connections finished or cut at the grace, the card
//! watch stopped, push's queue delivered within what is left of it, and
//! the link that delivers decisions let go off the runtime's threads).

use std::sync::{Arc, Mutex};

use super::intake::CardHook;
use super::settings::Settings;
use crate::error::Error;
use crate::grpc_link::merge_targets;
use crate::people::web::{self, Bound, Deps, KeptLink, Running};
use crate::store::Store;

/// The people's listener: none, bound (with what it works with), or
/// opened (serving once started).
enum Web {
    Off,
    Bound(Box<(Bound, Deps)>),
    Opened(Box<Running>),
}

/// The people's listener.
pub struct People {
    web: Web,
    /// The link the web app made last to the members (a runtime of its
    /// own: let go on a blocking thread at the end).
    link: KeptLink,
}

impl std::fmt::Debug for People {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = match &self.web {
            Web::Off => "off",
            Web::Bound(_) => "bound",
            Web::Opened(_) => "opened",
        };
        f.debug_struct("People").field("web", &state).finish()
    }
}

/// What became of the people's listener at the drain.
#[derive(Clone, Copy, Debug, Default, serde::Serialize)]
pub struct PeopleStopped {
    /// Whether the web app was serving and has stopped.
    pub web: bool,
}

impl People {
    /// Everything that can fail, done: for `--web-listen`, the certificate
    /// and key, the socket bound, the relay's key (decisions made there are
    /// signed with it), push's VAPID key. Needs the serving runtime's
    /// context; nothing is accepted yet.
    pub fn prepare(settings: &Settings) -> Result<People, Error> {
        let link: KeptLink = Arc::new(Mutex::new(None));
        let Some(mut config) = settings.web.clone() else {
            return Ok(People {
                web: Web::Off,
                link,
            });
        };
        let dir = &settings.control_dir;
        // Operators' client certificates (`/v1/`), under the operator CA
        // `init` made; a directory without one takes only passkeys.
        config.operators = crate::identity::OperatorTrust::load(dir)?;
        eprintln!(
            "{}",
            serde_json::json!({
                "web": "operator client certificates",
                "accepted": config.operators.is_some(),
                "operator_ca": dir.join(crate::identity::OPERATOR_CA_CERT).display().to_string(),
            })
        );
        let overrides = settings.gateways.clone();
        let deps = Deps {
            db: settings.db.clone(),
            relay_key: Arc::new(crate::identity::relay_key(dir)?),
            links: web::following_members(
                move |store: &Store| Ok(merge_targets(&store.members()?, &overrides)),
                Some(dir.clone()),
                Arc::clone(&link),
            ),
            verifier: Arc::new(crate::confirm::SignatureVerifier),
            vapid: match config.push {
                Some(_) => Some(crate::identity::vapid_key(dir)?),
                None => None,
            },
            clock: web::system_clock(),
        };
        let listen = config.listen;
        let socket = super::listener::bind(listen)?
            .into_std()
            .map_err(|e| Error::Io {
                what: format!("--web-listen {listen}"),
                reason: e.to_string(),
            })?;
        let bound = config.bind_on(socket)?;
        Ok(People {
            web: Web::Bound(Box::new((bound, deps))),
            link,
        })
    }

    /// What the ready line says of it: `"web": ADDR`.
    pub fn ready(&self, line: &mut serde_json::Value) {
        let addr = match &self.web {
            Web::Off => return,
            Web::Bound(b) => b.0.local_addr(),
            Web::Opened(o) => o.local_addr(),
        };
        line["web"] = serde_json::Value::String(addr.to_string());
    }

    /// Which listeners there are, for the drain's log lines.
    pub fn names(&self) -> Vec<&'static str> {
        match self.web {
            Web::Off => vec![],
            _ => vec!["web"],
        }
    }

    /// Open the web app: its store connections, Web Push, the card watch.
    /// Returns the hook the batch intake calls for each new card.
    pub async fn open(&mut self) -> Result<Option<CardHook>, Error> {
        let web = std::mem::replace(&mut self.web, Web::Off);
        let Web::Bound(bound) = web else {
            self.web = web;
            return Ok(None);
        };
        let (bound, deps) = *bound;
        let running = bound.open(deps).await?;
        let hook = running.card_hook();
        self.web = Web::Opened(Box::new(running));
        Ok(Some(hook))
    }

    /// Accept and serve (on the serving runtime), once opened.
    pub fn start(&mut self) {
        if let Web::Opened(o) = &mut self.web {
            o.serve();
        }
    }

    /// Stop accepting, close the socket, tell every connection to finish;
    /// the connections open then.
    pub async fn close(&self, grace: std::time::Duration) -> usize {
        match &self.web {
            Web::Opened(o) => o.close(grace),
            _ => 0,
        }
    }

    /// Wait until `deadline` for the connections (the rest are cut), the
    /// card watch and push's queue; then let go of the link that delivers
    /// decisions (it runs a runtime of its own, which may not end on the
    /// serving runtime's threads: it ends on a blocking thread).
    pub async fn stop(self, deadline: tokio::time::Instant) -> PeopleStopped {
        let mut stopped = PeopleStopped::default();
        if let Web::Opened(o) = self.web {
            o.finish(deadline).await;
            stopped.web = true;
        }
        let link = self.link;
        let _ = tokio::task::spawn_blocking(move || drop(link.lock().map(|mut l| l.take()))).await;
        stopped
    }
}
