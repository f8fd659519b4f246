//! The TALOS egress gateway: the only way out of a sandbox session.
//!
//! # Layout
//!
//! Modules are declared in the order a connection meets them; each depends
//! only on modules above it.
//!
//! - [`refusal`]: the closed set of refusal reasons and their stable names.
//! - [`name`]: canonical destination names.
//! - [`config`]: the TOML config, strictly validated.
//! - [`session`]: sessions by source address, and their allowlists.
//! - [`hello`]: the sans-IO, zero-copy ClientHello parser.
//! - [`capture`]: reading a hello off a socket, bounded in bytes and time.
//! - [`classify`]: which addresses are internal, and of which class.
//! - [`resolve`]: resolving a name and refusing internal answers.
//! - [`record`]: one record per connection, written as JSON lines.
//! - [`admin`]: metrics and health on the admin listener.
//! - [`conn`]: one connection, stage by stage, top to bottom.
//! - [`server`]: listeners, the connection cap, graceful shutdown.

#![forbid(unsafe_code)]

pub mod admin;
pub mod capture;
pub mod classify;
pub mod config;
pub mod conn;
pub mod hello;
pub mod name;
pub mod record;
pub mod refusal;
pub mod resolve;
pub mod server;
pub mod session;
