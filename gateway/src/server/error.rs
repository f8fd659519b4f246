//! Why the gateway could not start.

use std::net::SocketAddr;
use std::path::PathBuf;

/// Why the gateway could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("cannot bind the {which} listener on {addr}: {source}")]
    Bind {
        which: &'static str,
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("cannot bind the process socket {path}: {source}")]
    Socket {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot open the record file {path}: {source}")]
    Records {
        path: std::path::PathBuf,
        source: std::io::Error,
    },
    #[error("{0}")]
    Settings(String),
    #[error("{0}")]
    Secret(crate::secrets::secret::SecretError),
    #[error("{0}")]
    Control(String),
    #[error("{0}")]
    ControlTls(crate::tls::ControlTlsError),
    #[error("{0}")]
    PlaneTls(crate::tls::ControlTlsError),
    #[error(transparent)]
    SigningKey(#[from] talos_certs::KeyError),
    #[error(transparent)]
    Spool(#[from] crate::records::spool::SpoolError),
    #[error(transparent)]
    Journal(#[from] crate::records::journal::JournalError),
    #[error("cannot take over: {0}")]
    Takeover(String),
}
