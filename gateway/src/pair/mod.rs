//! What the members of a pair tell each other, sans-IO: how a member that
//! holds no authority for a live session hands that session's connection,
//! untouched and never decrypted, to a member that holds it
//! (`docs/design.md`, "The gateway pair"). The member link, which carries
//! it over TLS, is [`crate::member_link`].
//!
//! - [`proxy`]: the PROXY protocol version 2 header the link carries
//!   first, naming the session's real source address, so the holder
//!   judges the connection exactly as a direct one.
//! - [`forwarding`]: which live sessions other members hold and this one
//!   does not, as the control plane (or the peer itself) last said, each
//!   entry lapsing with the lease it was given under.

pub mod proxy;
pub mod forwarding;
