//! HTTP inside a session's TLS: one request at a time.
//!
//! - [`proxy`]: one request: checks, injection, forwarding, the reply.
//! - [`agent`]: approvals.hangar.internal, where agents propose actions.

pub mod proxy;
pub mod agent;
