//! The sessions' DNS, answered by the gateway itself: what a session may
//! learn of names is exactly what it may reach ([`query`] says how each
//! query is answered).
//!
//! - [`query`]: one query and its answer, bytes in, bytes out.

pub mod query;
