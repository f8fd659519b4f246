//! The member link of a pair: mutual TLS between members, over which a
//! member that holds no authority for a live session hands that session's
//! connection to a member that holds it ([`crate::pair`] holds what they
//! say: the header and the forwarding table).
//!
//! - [`link`]: the link itself, mutual TLS between members with the
//!   control identities, who may connect, and reaching a holder.
//! - [`stream`]: one forwarded connection as a stream of the link's
//!   HTTP/2 connection to the peer (one TLS connection per pair of
//!   members carries them all).

pub mod link;
pub mod stream;
