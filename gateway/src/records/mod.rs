//! What the gateway saw, on the record.
//!
//! - [`spool`]: records sealed in signed batches, kept on disk until shipped.
//! - [`record`]: one record per connection, written as JSON lines and batched.
//! - [`shipper`]: signed batches shipped to the control plane.

pub mod spool;
pub mod record;
pub mod shipper;
