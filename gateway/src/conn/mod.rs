//! One connection, top to bottom.
//!
//! [`serve`] runs the stages in the order a connection meets them — session
//! by source address, ClientHello, name check, resolve and classify, TLS
//! accept with the session's own CA, then HTTP, request by request, through
//! [`crate::http::proxy`] — and closes with exactly one record, whatever happened.
//! A destination the account marks passthrough meets every stage up to the
//! TLS accept, then has its bytes passed on to the checked address as they
//! are, never terminated ([`Conn::pass_through`]).
//! Stages do not call each other; each returns what the next needs, or a
//! refusal that ends the connection.
//!
//! When the session's authority ends (a close on the control channel), its
//! connections are cut wherever they are from the TLS handshake on, and
//! recorded `session_ended`.
//!
//! When the gateway drains (a shutdown signal, or a successor's `go`),
//! every open connection is told at once ([`Shutdown::drain`]) and
//! finishes gracefully: HTTP/1.1 closes an idle keep-alive connection and
//! answers the request in flight with `Connection: close`; HTTP/2 sends
//! GOAWAY and lets the streams already open end. What still runs when the
//! grace is over is cut ([`Shutdown::cut`]).
//!
//! Refusals before the TLS handshake close the connection; where the client
//! has shown it speaks TLS, a fatal TLS alert goes first so the client's
//! error names the kind of failure.
//!
//! # Files
//!
//! - [`stages`]: the stages, what is decided about a connection, and the
//!   one place its end is written down;
//! - [`drive`]: driving hyper over the session's TLS, and its timers;
//! - [`ending`]: what interrupts a connection and how it ended;
//! - [`client`]: the client's stream and the session's TLS over it.

mod client;
mod drive;
mod ending;
mod stages;

pub use client::ClientStream;
pub use ending::Cause;
pub use stages::{
    serve, serve_forwarded, session_socket_options, HandshakeFailure, PASSTHROUGH_IDLE,
};
