//! A session connection's client: its stream (a socket of the data
//! listener, or a member-link stream a peer forwarded), counted, and the
//! session's TLS over it.

use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;

use crate::io::counted::Counted;
use crate::io::replay::Replay;

/// A session connection's stream: a socket of the data listener, or a
/// member-link stream carrying a connection a peer forwarded.
pub trait ClientStream: AsyncRead + AsyncWrite + Unpin + Send {
    /// The TCP socket the session's bytes arrive on as they were sent, if
    /// they do (not through the member link's TLS).
    fn socket(&self) -> Option<&TcpStream>;
}

impl ClientStream for TcpStream {
    fn socket(&self) -> Option<&TcpStream> {
        Some(self)
    }
}

impl ClientStream for crate::member_link::link::Accepted {
    fn socket(&self) -> Option<&TcpStream> {
        None
    }
}

/// The client's stream, its bytes counted.
pub(super) type Client<S> = Counted<S>;

/// The session's TLS over the client, the hello's bytes replayed first.
pub(super) type SessionTls<'a, S> = Box<tokio_rustls::server::TlsStream<Replay<&'a mut Client<S>>>>;
