//! A session's authority on this gateway.
//!
//! - [`lease`]: authority leases and the clock they are read against.
//! - [`share`]: one session's share of the gateway: its bounds, counted.
//! - [`person`]: who decided: the person's passkey signature on a decision.
//! - [`approvals`]: the Lock's rules, requests held for approval, decisions.
//! - [`upstream`]: connections to destinations, pooled per session.
//! - [`dns`]: a session's DNS counts and their tally, until they go on the record.
//! - [`sessions`]: sessions by source address: allowlist, CA, TLS, pool, attachments.

pub mod lease;
pub mod share;
pub mod person;
pub mod approvals;
pub mod upstream;
pub mod dns;
pub mod sessions;
