//! The member-to-member link of a pair: how a member that holds no
//! authority for a live session hands that session's connection, untouched
//! and never decrypted, to a member that holds it (`docs/design.md`, "The
//! gateway pair").
//!
//! - [`proxy`]: the PROXY protocol version 2 header the link carries
//!   first, naming the session's real source address, so the holder
//!   judges the connection exactly as a direct one.
//! - [`link`]: the link itself, mutual TLS between members with the
//!   control identities, who may connect, and reaching a holder.
//! - [`stream`]: one forwarded connection as a stream of the link's
//!   HTTP/2 connection to the peer (one TLS connection per pair of
//!   members carries them all).
//! - [`forwarding`]: which live sessions other members hold and this one
//!   does not, as the control plane last said, each entry lapsing with
//!   the lease it was given under.
pub mod forwarding;
pub mod link;
pub mod proxy;
pub mod stream;
