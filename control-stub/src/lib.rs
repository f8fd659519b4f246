//! A slim, real stand-in for the TALOS control plane ("Hangar"): just
//! enough of it to run, demo and test the gateway end to end.
//!
//! It keeps the account's egress list and the tenants' secrets, drives
//! sessions through their states (start, pause, resume, interruption,
//! recovery, stop, Revoke All), opens and drops each session's authority on
//! the gateway pair, checks the gateways' signed drop reports, runs the
//! sandbox reset, consumes the gateways' record batches, and issues the
//! session certificate.
//!
//! # Layout
//!
//! Each module depends only on modules above it.
//!
//! - [`error`]: the one error enum and its stable codes.
//! - [`names`]: well-formed tenants, secret names, destinations, sources,
//!   attachments and secret values (the gateway's own rules).
//! - [`model`]: the closed vocabularies: modes, states, causes, reasons,
//!   reset steps.
//! - [`link`]: the control channel seen from here: [`GatewayLink`],
//!   [`ReportVerifier`], and the [`FakeLink`] tests drive.
//! - [`store`]: the SQLite store: schema, secret store, policy, sessions,
//!   batches.
//! - [`lifecycle`]: the session state machine and the reset.
//! - [`certificate`](mod@certificate): the session certificate.
//! - [`cli`]: the `control-stub` command line.

#![forbid(unsafe_code)]

pub mod error;
pub mod names;
pub mod model;
pub mod link;
pub mod store;
pub mod lifecycle;
pub mod certificate;
pub mod cli;

pub use certificate::{certificate, Certificate};
pub use error::Error;
pub use lifecycle::{Lifecycle, StartRequest, Status, Transition};
pub use link::{
    Attachment, CloseSession, DropReportView, FakeLink, FakeVerifier, GatewayLink, LinkError,
    OpenSession, Opened, ReportVerifier,
};
pub use model::{CloseReason, EndReason, Mode, OpenCause, State};
pub use store::{BatchOutcome, Store};
