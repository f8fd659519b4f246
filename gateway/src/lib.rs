//! The TALOS egress gateway: the only way out of a sandbox session.
//!
//! # Layout
//!
//! Modules are declared so that each depends only on modules above it; from
//! `hello` on, that is the order a connection meets them.
//!
//! - [`refusal`]: the closed set of refusal reasons and their stable names.
//! - [`name`]: canonical destination names.
//! - [`secret`]: secret values (zeroized, never printed) and attachments.
//! - [`mask`]: masking secret values (and their encodings) in replies.
//! - [`config`]: the TOML config, strictly validated.
//! - [`tls`]: TLS 1.3 configs for both sides, and stream adapters.
//! - [`upstream`]: connections to destinations, pooled per session.
//! - [`approval`]: the Lock's rules, requests held for approval, decisions.
//! - [`session`]: sessions by source address: allowlist, CA, TLS, pool, attachments.
//! - [`hello`]: the sans-IO, zero-copy ClientHello parser.
//! - [`capture`]: reading a hello off a socket, bounded in bytes and time.
//! - [`classify`]: which addresses are internal, and of which class.
//! - [`resolve`]: resolving a name and refusing internal answers.
//! - [`spool`]: records sealed in signed batches, kept on disk until shipped.
//! - [`record`]: one record per connection, written as JSON lines and batched.
//! - [`decode`]: decoding compressed replies before masking.
//! - [`reply`]: a reply on its way to the session: decoded and masked.
//! - [`admin`]: metrics and health on the admin listener.
//! - [`proxy`]: one request: checks, injection, forwarding, the reply.
//! - [`agent`]: approvals.hangar.internal, where agents propose actions.
//! - [`conn`]: one connection, stage by stage, top to bottom.
//! - [`control`]: the control channel: sessions opened and closed over
//!   mutually authenticated gRPC, drop reports signed.
//! - [`shipper`]: signed batches shipped to the control plane.
//! - [`server`]: listeners, the connection cap, graceful shutdown.

#![forbid(unsafe_code)]

pub mod refusal;
pub mod name;
pub mod secret;
pub mod mask;
pub mod config;
pub mod tls;
pub mod upstream;
pub mod approval;
pub mod session;
pub mod hello;
pub mod capture;
pub mod classify;
pub mod resolve;
pub mod spool;
pub mod record;
pub mod decode;
pub mod reply;
pub mod admin;
pub mod proxy;
pub mod agent;
pub mod conn;
pub mod woken;
pub mod control;
pub mod shipper;
pub mod server;
