//! The gate: what a connection must pass before the TLS handshake.
//!
//! - [`name`]: canonical destination names.
//! - [`hello`]: the sans-IO, zero-copy ClientHello parser.
//! - [`capture`]: reading a hello off a socket, bounded in bytes and time.
//! - [`classify`]: which addresses are internal, and of which class.
//! - [`resolve`]: resolving a name and refusing internal answers.

pub mod name;
pub mod hello;
pub mod capture;
pub mod classify;
pub mod resolve;
