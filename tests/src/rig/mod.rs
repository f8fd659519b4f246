//! The rigs the end-to-end tests stand on: everything a test starts
//! before its first step, in a temporary folder, stopped when the rig
//! drops.
//!
//! - [`Single`]: one gateway and what is behind it (an origin and a DNS
//!   server on loopback), with one static session or a control channel
//!   the test plays the control plane on.
//! - [`Pair`]: the members of a pair (or a single member) under the
//!   control stub: `control-stub serve`, the CLI, and the session
//!   commands an operator runs.
//!
//! Either starts its gateways as plain [`Gateway`]s or as [`Member`]s
//! followed across handovers (with a process socket, for `gateway reload`
//! and `gateway upgrade`): see [`Process`].

use std::net::SocketAddr;
use std::path::Path;

use crate::gateway::{Gateway, TestConfig};
use crate::member::Member;
use crate::origin::LoopbackOrigin;

pub mod pair;
pub mod single;

pub use pair::{Pair, SessionSpec};
pub use single::Single;

/// How a rig starts a gateway process and finds its listeners.
pub trait Process: Sized {
    /// The config text it is started with from `config`, in `dir`.
    fn toml(config: &TestConfig, dir: &Path) -> String;
    /// Start it in `dir` with `toml` (see [`Process::toml`]).
    fn start(dir: &Path, toml: &str) -> Self;
    /// The data listener.
    fn data(&self) -> SocketAddr;
    /// The control listener (the config has a `[control]` table).
    fn control(&self) -> SocketAddr;
    /// What it logged so far.
    fn log(&self) -> String;
    /// The sessions' DNS answerer (the config has a `[dns]` table).
    fn answerer(&self) -> Option<SocketAddr>;
}

impl Process for Gateway {
    fn toml(config: &TestConfig, dir: &Path) -> String {
        config.toml(dir)
    }

    fn start(dir: &Path, toml: &str) -> Gateway {
        Gateway::start(dir, toml)
    }

    fn data(&self) -> SocketAddr {
        self.data
    }

    fn control(&self) -> SocketAddr {
        self.control.expect("control listener")
    }

    fn log(&self) -> String {
        Gateway::log(self)
    }

    fn answerer(&self) -> Option<SocketAddr> {
        self.answerer
    }
}

impl Process for Member {
    /// With a process socket in `dir`.
    fn toml(config: &TestConfig, dir: &Path) -> String {
        TestConfig {
            process_socket: Some(dir.join("gateway.sock")),
            ..config.clone()
        }
        .toml(dir)
    }

    fn start(dir: &Path, toml: &str) -> Member {
        Member::start(dir, toml)
    }

    fn data(&self) -> SocketAddr {
        Member::data(self)
    }

    fn control(&self) -> SocketAddr {
        Member::control(self)
    }

    fn log(&self) -> String {
        Member::log(self)
    }

    fn answerer(&self) -> Option<SocketAddr> {
        self.ready_lines()[0]["dns"]
            .as_str()
            .map(|a| a.parse().expect("addr"))
    }
}

/// A temporary folder with one origin in it serving `names` (see
/// [`LoopbackOrigin::serving`]), and the gateway config that reaches it.
async fn loopback(names: &[&str]) -> (tempfile::TempDir, LoopbackOrigin, TestConfig) {
    let tmp = tempfile::tempdir().expect("tempdir");
    let peers = LoopbackOrigin::serving(tmp.path(), names).await;
    let base = peers.config();
    (tmp, peers, base)
}

/// Runs `f`, which blocks (a CLI command, a wait that polls one), without
/// holding up the tasks of a multi-threaded runtime it is called on:
/// those on this worker move to another meanwhile.
pub fn blocking<T>(f: impl FnOnce() -> T) -> T {
    match tokio::runtime::Handle::try_current().map(|h| h.runtime_flavor()) {
        Ok(tokio::runtime::RuntimeFlavor::MultiThread) => tokio::task::block_in_place(f),
        _ => f(),
    }
}
