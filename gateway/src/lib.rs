//! The TALOS egress gateway: the only way out of a sandbox session.
//!
//! # Layout
//!
//! Modules and folders are declared so that each uses only those above it
//! (`scripts/check-layering.py` checks it, and that no files import each
//! other in a circle): first what a connection is judged and served with
//! (sans-IO cores and state), then what owns sockets and tasks, then the
//! process that builds, starts and stops them. [`conn`] runs one connection
//! through the stages.
//!
//! - [`refusal`]: the closed set of refusal reasons and their stable names.
//! - [`io`]: stream adapters: replayed hello bytes, byte counts, gathered writes, [`io::woken`].
//! - [`gate`]: before the handshake: name, ClientHello, capture, address classes, resolution.
//! - [`dns`]: the sessions' DNS queries, sans-IO: listed names only, nothing looked up for others.
//! - [`pair`]: what members of a pair tell each other, sans-IO: the PROXY v2
//!   header the member link carries, the forwarding table.
//! - [`secrets`]: secret values and attachments; decoding and masking replies.
//! - [`tls`]: every rustls config: toward sessions, destinations, and on the
//!   control channel and the member link; whose role a certificate carries.
//! - [`pb`]: the control channel's generated messages and services (the
//!   `talos-contract` crate's, which also holds the session rules).
//! - [`config`]: the TOML config, strictly validated.
//! - [`logging`]: logs on standard error, at a level a reload changes.
//! - [`session`]: a session's authority: its lease, its share (per-session
//!   bounds), the Lock and holds, the upstream pool, its DNS counts, sessions by source.
//! - [`records`]: connection records, the journal, signed batches on disk, the shipper.
//! - [`process`]: the process socket's frames, readiness notifications, the
//!   link to the process this one took over from.
//! - [`authority`]: the end of a session's authority (close, lapse, replacement,
//!   shutdown) with its signed drop report in the batch chain; the lease watcher.
//! - [`member_link`]: the member link: mutual TLS between members, each
//!   forwarded connection a stream of it.
//! - [`serving`]: what connections, DNS queries and control calls are served
//!   with (the process-wide context a reload replaces), and the drain's signals.
//! - [`dns_answerer`]: the DNS answerer: the UDP and TCP listeners, each
//!   session's share of queries, queries passed to a holder, the counts recorded.
//! - [`http`]: one request: the proxy, and approvals.hangar.internal.
//! - [`conn`]: one connection, stage by stage, top to bottom; driving hyper apart.
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
pub mod gate;
pub mod dns;
pub mod pair;
pub mod secrets;
pub mod tls;
pub mod pb;
pub mod config;
pub mod logging;
pub mod session;
pub mod records;
pub mod process;
pub mod authority;
pub mod member_link;
pub mod serving;
pub mod dns_answerer;
pub mod http;
pub mod conn;
pub mod control;
pub mod reload;
pub mod admin;
pub mod handover;
pub mod server;
