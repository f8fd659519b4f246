//! The sessions' DNS, answered by the gateway itself: what a session may
//! learn of names is exactly what it may reach ([`query`] says how each
//! query is answered).
//!
//! - [`query`]: one query and its answer, bytes in, bytes out.
//! - [`answerer`]: the listeners (UDP and TCP), whose query it is, each
//!   session's share, the queries passed to a peer that holds the
//!   session, the counts on the record.

pub mod answerer;
pub mod query;
