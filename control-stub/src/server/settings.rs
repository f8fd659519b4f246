//! What `serve` is started with: where the store and the control
//! identity are, the members given on the command line, the addresses it
//! listens on, how often its loops run and how long its drain waits.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use crate::error::Error;
use crate::store::Db;

/// How long connections get to finish at the drain, from its start, by
/// default: a batch or a decision under way is a store transaction and
/// one answer, far under this, and systemd's stop timeout for the unit
/// (30 s, `ops/systemd/talos-control-stub.service`) leaves room after it
/// for the store's work that cannot be cut.
pub const DEFAULT_GRACE: Duration = Duration::from_secs(10);

/// `serve`'s settings, as the command line gives them.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The store (`--db`).
    pub db: Db,
    /// The directory `init` wrote (`--control-dir`): the stub's identity,
    /// the relay's and the plane's keys.
    pub control_dir: PathBuf,
    /// `--gateway [ID=]ADDR`: members given on the command line, merged
    /// with the store's (`gateway add`), overriding a stored address of
    /// the same id.
    pub gateways: Vec<String>,
    /// The control listener (`--listen`; port 0: any free port).
    pub listen: SocketAddr,
    /// The people's web app (`--web-listen` and its settings), if served.
    pub web: Option<crate::people::web::WebConfig>,
    /// The metrics endpoint (`--metrics-listen`), if served.
    pub metrics: Option<SocketAddr>,
    /// How often each member is described and its leases renewed
    /// (`--renew-ms`).
    pub renew: Duration,
    /// How often closes owed are asked again, the time-driven events run
    /// and certificates issued (`--tick-ms`).
    pub tick: Duration,
    /// How long connections get to finish at the drain (`--grace-ms`).
    pub grace: Duration,
}

impl Settings {
    /// Refuse settings the loops cannot run with.
    pub fn check(&self) -> Result<(), Error> {
        if self.tick.is_zero() || self.renew < self.tick {
            return Err(Error::invalid(
                "--tick-ms must be at least 1 and --renew-ms at least --tick-ms",
            ));
        }
        Ok(())
    }
}
