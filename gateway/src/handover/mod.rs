//! Restart and upgrade without losing a session: the running process hands
//! every live authority and its listening sockets to a successor on the
//! same machine, over the process socket.
//!
//! # Why this keeps "the key stayed in the gateway's memory"
//!
//! A session's CA keys exist only in the gateway's memory; a restart that
//! dropped them would end every authority on the member. A handover moves
//! them from one gateway process to the next without their ever touching a
//! disk: the old process encodes each intermediate's key (PKCS#8) into a
//! buffer wiped on drop, writes it to a Unix socket only the gateway's
//! user can open, and the successor — which the old process itself
//! started, and which must prove it by its process id (`SO_PEERCRED`) —
//! reads it into a wiped buffer and into aws-lc. The same goes for
//! attached values. Core dumps are off in both. The root keys are long
//! gone (see `talos_certs`): the successor can mint leaves, never another
//! CA.
//!
//! # The steps
//!
//! 1. `gateway upgrade` (or SIGUSR2) asks the running process; it starts
//!    its own binary's path again (so a new binary installed there runs)
//!    with `run --config <same file> --takeover`.
//! 2. The successor reads its config (a bad one: it says why over the
//!    socket and exits; the old process goes on, nothing changed) and
//!    connects; the old process checks that the peer is its child.
//! 3. The old process **freezes** what could change an authority: the
//!    control channel stops serving (calls in progress finish; new ones
//!    wait in its listener's backlog), the lease watcher stops, ends in
//!    progress finish, reloads wait. Connections go on being served.
//! 4. It sends the [`state::Offer`]: every live authority (CA, names,
//!    Lock, first uses, lease end, sources), the reports of the ends it
//!    remembers, the static sessions' definitions, how its listeners are
//!    configured and which fields only a restart changes, the member
//!    link's forwarding table as it stands (each entry with its end on
//!    `CLOCK_BOOTTIME`); then the listening sockets (`SCM_RIGHTS`); then
//!    the secrets, frame by frame.
//! 5. The successor checks that its config changes no field only a
//!    restart changes, imports everything, starts its record writer (a
//!    journal of its own) and every task but the accept loops, and says
//!    `ready`.
//! 6. The old process stops accepting (connections arriving wait in the
//!    listeners' backlogs, which both processes share: none is refused),
//!    says `go`, and the successor accepts. It serves nothing on a socket
//!    before what judges it is in place — the authorities and the
//!    forwarding table were taken up at step 5 — so a session's query or
//!    connection is answered as the old process would have answered it.
//!    From here the successor holds every authority; the old process
//!    drains the connections it had accepted, within the grace, and exits
//!    ([`crate::process::link`]).
//! 7. Any failure before `go` — a refusal, a crash, a timeout — and the
//!    old process unfreezes and goes on serving; the successor, if still
//!    running, is killed. `gateway_handover_total{result}` counts both:
//!    `failed` in the old process, which goes on serving; `ok` in the
//!    successor once it has `go`, counting on from the old process's
//!    counts (the offer carries them), so that the scrape after an upgrade
//!    shows one more.
//!
//! The signing key is the same file, and the successor checks it is the
//! same key. The batch chain goes on without a gap: the old process seals
//! and spools its last records before it exits; the successor journals
//! its own meanwhile and seals them only once the old process is gone and
//! the spool's lock is free. The successor is the same instance (its
//! records and reports say so) in a new generation: its connections are
//! numbered from `generation << 40`. It makes no start report: nothing
//! started afresh.

//!
//! # Files
//!
//! - `old`: the running process's side ([`Upgrader`]): start the
//!   successor, freeze, offer, wait for `ready`, stop accepting, `go`;
//! - `successor`: the new process's side ([`take_over`],
//!   [`ready_and_go`]);
//! - `socket`: the process socket's request server ([`SocketServer`]),
//!   which answers `gateway reload` and `gateway upgrade` and hands a
//!   successor's arrival to the upgrade waiting for it;
//! - `state`: what the offer carries.

pub mod state;

mod old;
mod protocol;
mod socket;
mod successor;

use std::path::Path;
use std::time::Duration;

use tokio::net::UnixStream;

use crate::process::wire;

pub use old::{HandedOver, Holdings, Listeners, UpgradeError, Upgrader};
pub use protocol::{Answer, Request, Step, SOCKET_ENV, TAKEOVER_TIMEOUT};
pub(crate) use protocol::{EXIT_WORD, REQUEST_TIMEOUT};
pub use socket::{bind, SocketServer};
pub use successor::{ready_and_go, refuse_early, refuse_on, take_over, Taken, TakeoverError};

/// Ask the process at `socket` (the `gateway reload` and `gateway upgrade`
/// commands). Waits up to `timeout` for the answer.
pub async fn ask(socket: &Path, request: &Request, timeout: Duration) -> std::io::Result<Answer> {
    let mut stream = UnixStream::connect(socket).await?;
    wire::write_json(&mut stream, request).await?;
    tokio::time::timeout(timeout, wire::read_json(&mut stream))
        .await
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "no answer in time"))?
}
