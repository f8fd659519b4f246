//! The member-to-member link of a pair: how a member that holds no
//! authority for a live session hands that session's connection, untouched
//! and never decrypted, to a member that holds it (`docs/design.md`, "The
//! gateway pair").
//!
//! - [`proxy`]: the PROXY protocol version 2 header the link carries
//!   first, naming the session's real source address, so the holder
//!   judges the connection exactly as a direct one.
pub mod proxy;
