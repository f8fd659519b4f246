//! The successor's side of a handover: connect to the running process,
//! read its offer, listeners and secrets, check its own config against
//! them, and say `ready` (or why it refuses); accept once told `go`.

use std::collections::HashMap;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

use tokio::net::UnixStream;
use zeroize::Zeroizing;

use super::state::{self, Offer};
use super::{Request, Step, SOCKET_ENV};
use crate::config::Config;
use crate::process::wire;

/// What a successor received.
pub struct Taken {
    pub offer: Offer,
    /// The descriptors, by listener role.
    pub fds: HashMap<String, OwnedFd>,
    /// The secret frames, in order.
    pub secrets: Vec<Zeroizing<Vec<u8>>>,
}

impl std::fmt::Debug for Taken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Taken")
            .field("sessions", &self.offer.sessions.len())
            .field("fds", &self.fds.len())
            .field("secrets", &self.secrets.len())
            .finish()
    }
}

/// Why a successor could not take over.
#[derive(Debug, thiserror::Error)]
pub enum TakeoverError {
    #[error("no [process] socket in the config: nothing to take over from")]
    NoSocket,
    #[error("cannot reach the running process at {path}: {source}")]
    Connect {
        path: String,
        source: std::io::Error,
    },
    #[error("the handover broke: {0}")]
    Io(#[from] std::io::Error),
    #[error("{0}")]
    Refused(String),
}

/// The successor's side: connect to the running process, and read its
/// offer, descriptors and secrets. The stream stays open for the rest of
/// the handover (see [`ready_and_go`]) and the link.
pub async fn take_over(config: &Config, path: &Path) -> Result<(Taken, UnixStream), TakeoverError> {
    let socket = config
        .process
        .socket
        .as_ref()
        .map(|s| s.get_ref().clone())
        .ok_or(TakeoverError::NoSocket)?;
    let mut stream =
        UnixStream::connect(&socket)
            .await
            .map_err(|source| TakeoverError::Connect {
                path: socket.display().to_string(),
                source,
            })?;
    wire::write_json(
        &mut stream,
        &Request::Takeover {
            pid: std::process::id(),
        },
    )
    .await?;
    let offer: Offer = wire::read_json(&mut stream).await?;
    let fds = wire::recv_fds(&stream, offer.listeners.len()).await?;
    let mut secrets = Vec::with_capacity(offer.secrets.min(1 << 20));
    for _ in 0..offer.secrets {
        secrets.push(wire::read_secret(&mut stream).await?);
    }
    let refuse = |reason: String| TakeoverError::Refused(reason);
    let checked = (|| {
        if offer.version != state::VERSION {
            return Err(refuse(format!(
                "the running process hands over version {}, this binary takes {}",
                offer.version,
                state::VERSION
            )));
        }
        if offer.gateway_id != *config.gateway_id.get_ref() {
            return Err(refuse(
                config
                    .changed_field(path, "gateway_id", &offer.gateway_id)
                    .to_string(),
            ));
        }
        let running: Vec<(&'static str, String)> = offer
            .restart_only
            .iter()
            .filter_map(|(f, v)| {
                config
                    .restart_only()
                    .into_iter()
                    .find(|(mine, _)| mine == f)
                    .map(|(name, _)| (name, v.clone()))
            })
            .collect();
        if running.len() != offer.restart_only.len() {
            return Err(refuse(
                "the running process has fields this binary does not know".into(),
            ));
        }
        config
            .check_restart_only(path, &running)
            .map_err(|e| refuse(e.to_string()))
    })();
    if let Err(e) = checked {
        refuse_on(&mut stream, &e.to_string()).await;
        return Err(e);
    }
    let fds = offer
        .listeners
        .iter()
        .map(|l| l.role.clone())
        .zip(fds)
        .collect();
    Ok((
        Taken {
            offer,
            fds,
            secrets,
        },
        stream,
    ))
}

/// Tell the running process this successor refuses (best effort).
pub async fn refuse_on(stream: &mut UnixStream, reason: &str) {
    let _ = wire::write_json(
        stream,
        &Step::Refused {
            reason: reason.to_owned(),
        },
    )
    .await;
}

/// A successor whose config does not even load says so to the process
/// that started it (named by [`SOCKET_ENV`]) before it exits.
pub async fn refuse_early(reason: &str) {
    let Some(socket) = std::env::var_os(SOCKET_ENV) else {
        return;
    };
    if let Ok(mut stream) = UnixStream::connect(PathBuf::from(socket)).await {
        let _ = wire::write_json(
            &mut stream,
            &Request::Refuse {
                pid: std::process::id(),
                reason: reason.to_owned(),
            },
        )
        .await;
    }
}

/// Say `ready` and wait for `go`: then this process accepts.
pub async fn ready_and_go(stream: &mut UnixStream) -> Result<(), TakeoverError> {
    wire::write_json(stream, &Step::Ready).await?;
    match wire::read_json::<Step, _>(stream).await? {
        Step::Go => Ok(()),
        other => Err(TakeoverError::Refused(format!(
            "the running process answered {other:?} instead of go"
        ))),
    }
}
