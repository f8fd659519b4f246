//! What the gateway saw, on the record.
//!
//! - [`record`]: one record per connection.
//! - [`journal`]: records written, synced and kept until sealed; openings,
//!   so a crash leaves no connection off the record.
//! - [`spool`]: records sealed in signed batches, kept on disk until shipped.
//! - [`repair`]: a blocked spool checked, and a bad batch set aside as a
//!   signed gap.
//! - [`shipper`]: signed batches shipped to the control plane.

pub mod record;
pub mod journal;
pub mod spool;
pub mod repair;
pub mod shipper;
