//! Logs on standard error, with a level a reload can change.
//!
//! The filter is the config's `[log] level` (default `info`); `RUST_LOG`,
//! when set, wins over it, at start and at every reload (an operator who
//! set it for a session of debugging keeps it).

use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;
use tracing_subscriber::{reload, EnvFilter, Registry};

/// Changes the level of the process's logs.
#[derive(Clone, Debug)]
pub struct LogControl {
    handle: reload::Handle<EnvFilter, Registry>,
    /// `RUST_LOG` was set: it wins.
    from_env: bool,
}

/// Install the process's logger with `directives` (or `RUST_LOG`), as JSON
/// lines or text. Call once, before anything logs.
pub fn init(json: bool, directives: &str) -> LogControl {
    let (filter, from_env) = match EnvFilter::try_from_default_env() {
        Ok(f) => (f, true),
        Err(_) => (
            EnvFilter::builder()
                .parse(directives)
                .unwrap_or_else(|_| EnvFilter::new("info")),
            false,
        ),
    };
    let (filter, handle) = reload::Layer::new(filter);
    use std::io::IsTerminal;
    let fmt = tracing_subscriber::fmt::layer()
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr);
    let registry = tracing_subscriber::registry().with(filter);
    if json {
        registry.with(fmt.json()).init();
    } else {
        registry.with(fmt).init();
    }
    LogControl { handle, from_env }
}

impl LogControl {
    /// Check `directives` without applying them.
    pub fn check(directives: &str) -> Result<EnvFilter, String> {
        EnvFilter::builder()
            .parse(directives)
            .map_err(|e| e.to_string())
    }

    /// Log with `filter` from now on (unless `RUST_LOG` set the level).
    pub fn set(&self, filter: EnvFilter) {
        if self.from_env {
            return;
        }
        if let Err(e) = self.handle.reload(filter) {
            tracing::warn!(error = %e, "cannot change the log level");
        }
    }
}
