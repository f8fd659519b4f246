//! What every request of the web app is served with ([`App`]), what the
//! app works with besides its config ([`Deps`]: the store, the relay's
//! key, the gateways, the clock), and the bounds its routes read.

use std::sync::Arc;
use std::time::SystemTime;

use talos_certs::GatewayKey;
use tokio::sync::watch as tokio_watch;

use super::super::push::Push;
use super::super::rp::RelyingParty;
use super::pool::Pool;
use super::watch::Watch;
use crate::error::Error;
use crate::identity::VapidKey;
use crate::link::{GatewayLink, ReportVerifier};
use crate::store::{Db, Store};

/// The largest request body read: 64 KiB. The largest the pages send is
/// an enrolment's attestation (a few hundred bytes with attestation
/// `none`, at most 16 KiB as WebAuthn bounds it, base64url).
pub const MAX_BODY: usize = 64 * 1024;

/// What tells the app the time: the system's clock, or a test's.
pub type Clock = Arc<dyn Fn() -> SystemTime + Send + Sync>;

/// A link to the gateways, shared.
pub type SharedLink = Arc<dyn GatewayLink + Send + Sync>;

/// Where the app's decisions and Revoke All reach the gateways: the link
/// to the members the store names now (asked with the store connection of
/// the request that needs it).
pub type Links = Arc<dyn Fn(&Store) -> Result<SharedLink, Error> + Send + Sync>;

/// What the web app works with besides its config.
pub struct Deps {
    /// The store (the app opens [`super::STORE_CONNECTIONS`] connections of its
    /// own, and one for push).
    pub db: Db,
    /// The relay's signing key: decisions made here are signed with it.
    pub relay_key: Arc<GatewayKey>,
    /// The gateways: decisions and Revoke All reach them through it.
    pub links: Links,
    /// Checks the drop reports a Revoke All brings back.
    pub verifier: Arc<dyn ReportVerifier + Send + Sync>,
    /// The VAPID key, when push is on.
    pub vapid: Option<VapidKey>,
    /// The time: the system's clock but in tests.
    pub clock: Clock,
}

impl std::fmt::Debug for Deps {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Deps")
            .field("db", &self.db)
            .finish_non_exhaustive()
    }
}

/// The system's clock.
pub fn system_clock() -> Clock {
    Arc::new(SystemTime::now)
}

/// What every request is served with.
pub(crate) struct App {
    pub(crate) rp: RelyingParty,
    /// Whom a client certificate proves an operator (`/v1/`); none: no
    /// client certificate is taken.
    pub(crate) operators: Option<crate::identity::OperatorTrust>,
    pub(crate) pool: Arc<Pool>,
    pub(crate) deps: Deps,
    pub(crate) push: Option<Push>,
    pub(crate) watch: Watch,
    pub(crate) shutdown: tokio_watch::Receiver<bool>,
}

impl App {
    pub(crate) fn now(&self) -> SystemTime {
        (self.deps.clock)()
    }
}
