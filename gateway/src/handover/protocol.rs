//! What the process socket carries, and its timings: the questions
//! ([`Request`]) and their answers, a successor's steps after the offer,
//! and the environment variable that names the socket to a successor.

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// The longest a successor may take from its start to `ready`.
pub const TAKEOVER_TIMEOUT: Duration = Duration::from_secs(60);

/// How long, once a successor has exited, its last word may take to come.
pub(crate) const EXIT_WORD: Duration = Duration::from_secs(2);

/// The longest one question on the process socket may take to arrive.
pub(crate) const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// The environment variable that names the process socket to a successor
/// (so that it can say why it refuses even when its config does not load).
pub const SOCKET_ENV: &str = "TALOS_GATEWAY_TAKEOVER_SOCKET";

/// A question on the process socket.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "command", rename_all = "snake_case")]
pub enum Request {
    /// Read the config again (as SIGHUP does). `config` is the file the
    /// asker means (`gateway reload --config`), made absolute: another
    /// file than the one this process runs with is refused.
    Reload { config: PathBuf },
    /// Start a successor and hand over to it (as SIGUSR2 does).
    Upgrade,
    /// A successor: hand over to me.
    Takeover { pid: u32 },
    /// A successor that cannot take over, and why.
    Refuse { pid: u32, reason: String },
}

/// The answer to a [`Request`].
#[derive(Debug, Serialize, Deserialize)]
pub struct Answer {
    pub ok: bool,
    pub message: String,
    /// The successor's process id (an upgrade).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pid: Option<u32>,
    /// The config's digest (a reload).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub digest: Option<String>,
}

/// A successor's steps after the offer, and the old process's answer.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "step", rename_all = "snake_case")]
pub enum Step {
    Ready,
    Refused { reason: String },
    Go,
}
