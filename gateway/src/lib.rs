//! The TALOS egress gateway: the only way out of a sandbox session.
//!
//! # Layout
//!
//! Modules and folders are declared so that each depends only on those
//! above it; from [`gate`] on, that is the order a connection meets them.
//! [`conn`] runs one connection through them, top to bottom.
//!
//! - [`refusal`]: the closed set of refusal reasons and their stable names.
//! - [`io`]: stream adapters: replayed hello bytes, byte counts, gathered writes, [`io::woken`].
//! - [`pair`]: the member-to-member link: the PROXY v2 header it carries.
//! - [`gate`]: before the handshake: name, ClientHello, capture, address classes, resolution.
//! - [`secrets`]: secret values and attachments; decoding and masking replies.
//! - [`tls`]: every rustls config: toward sessions, destinations, and on the control channel.
//! - [`pb`]: the control channel's generated messages and services (the
//!   `talos-contract` crate's, which also holds the session rules).
//! - [`config`]: the TOML config, strictly validated.
//! - [`logging`]: logs on standard error, at a level a reload changes.
//! - [`dns`]: the sessions' DNS queries answered: listed names only, nothing looked up for others.
//! - [`session`]: a session's authority: its lease, its share (per-session bounds), the Lock and holds, the upstream pool, sessions by source.
//! - [`records`]: connection records, the journal, signed batches on disk, the shipper.
//! - [`process`]: the process socket's frames, readiness notifications, the
//!   link to the process this one took over from.
//! - [`authority`]: the end of a session's authority (close, lapse, replacement,
//!   shutdown) with its signed drop report in the batch chain; the lease watcher.
//! - [`http`]: one request: the proxy, and approvals.hangar.internal.
//! - [`conn`]: one connection, stage by stage, top to bottom.
//! - [`control`]: the control channel: sessions opened and closed over
//!   mutually authenticated gRPC, drop reports signed.
//! - [`reload`]: the config read again, built whole, then applied at once
//!   or not at all.
//! - [`admin`]: metrics and health on the admin listener.
//! - [`handover`]: every live authority and the listeners handed to a
//!   successor process (restarts and upgrades that keep every session).
//! - [`server`]: listeners, the connection cap, graceful shutdown.

#![forbid(unsafe_code)]

pub mod refusal;
pub mod io;
pub mod pair;
pub mod gate;
pub mod secrets;
pub mod tls;
pub mod pb;
pub mod config;
pub mod logging;
pub mod dns;
pub mod session;
pub mod records;
pub mod process;
pub mod authority;
pub mod http;
pub mod serving;
pub mod conn;
pub mod control;
pub mod reload;
pub mod admin;
pub mod handover;
pub mod server;
