//! The sessions' DNS, sans-IO: what a session may learn of names is
//! exactly what it may reach ([`query`] says how each query is answered).
//! The DNS answerer, which owns the sockets and calls this, is
//! [`crate::dns_answerer`].
//!
//! - [`query`]: one query and its answer, bytes in, bytes out.

pub mod query;
