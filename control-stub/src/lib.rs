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
//! - [`error`]: the one error enum and its stable codes, and [`LinkError`]:
//!   how a call to the gateways fails.
//! - [`pb`]: the control channel's messages, client and server, compiled
//!   from `gateway/proto/control.proto`.
//! - [`names`]: well-formed tenants, secret names, destinations, sources,
//!   attachments and secret values (the gateway's own rules).
//! - [`identity`]: the control channel's certificates: `init` makes them,
//!   both ends load them; and the control plane's keys (relay, plane,
//!   VAPID).
//! - [`model`]: the closed vocabularies: modes, states, causes, reasons,
//!   reset steps.
//! - [`machine`]: the session state machine as one pure function: state
//!   × mode × event → the next state and what the transition does, or the
//!   stable refusal.
//! - [`lock`]: the Lock's rules: what they match and how they are checked.
//! - [`link`]: the control channel seen from here: [`GatewayLink`] and
//!   [`ReportVerifier`], and the stand-ins that reach no gateway.
//! - `fake` (only with the `test-util` feature): the test doubles the
//!   tests drive, `FakeLink` (a stand-in gateway pair) and `FakeVerifier`.
//! - [`store`] (a folder): the SQLite store: the schema and the connection
//!   (`schema`, `db`), then one file per group of tables: sessions, reset
//!   (CAs, drop reports, closes owed, steps), secrets, policy, gateways (and
//!   start reports), batches, approvals, certificates, commands, members,
//!   push subscriptions.
//! - [`confirm`]: what confirms that an authority is gone — a close's
//!   reply, a drop report or start report from a gateway's batch chain —
//!   the drop report signature check ([`SignatureVerifier`]), and the
//!   reset steps resting on them.
//! - [`batches`]: the batch consumer's check: a signed batch verified
//!   (signature, sequence, chain) with talos-certs, its reports confirmed,
//!   and the store told the verdict.
//! - [`series`]: the metrics `serve` exports, each member's at 0 from the
//!   start.
//! - [`grpc_link`]: the control channel client ([`GrpcLink`]).
//! - [`trust`]: the trust bundle a session's instance is given: its
//!   session CAs and, when it lists a passthrough name, the public roots.
//! - [`lifecycle`]: the sessions driven through the machine's decisions:
//!   each committed first, then the members asked and their answers
//!   recorded; opens on every member that answers, closes owed until
//!   confirmed.
//! - [`relay`]: the approval relay: proposals in, signed decisions out.
//! - [`certificate`](mod@certificate): the session certificate.
//! - [`bundle`]: the certificate bundle: the issued certificate with every
//!   signed batch, report and decision it rests on and the keys that made
//!   them, for a reviewer who checks it alone.
//! - [`upkeep`]: `serve`'s loop: members described, leases renewed,
//!   closes owed asked again, the spec's time-driven events, certificates
//!   issued, metrics.
//! - [`serve`]: the `ControlPlane` service: the batch consumer and the
//!   relay's `Propose`; signals; the metrics listener.
//! - [`people`] (a folder): what the control plane does for people —
//!   approvers and operators: who they are and their passkeys
//!   (`accounts`), the passkey ceremonies and what a signed request may do
//!   (`ceremony`), a card's text made safe to show (`text`), Web Push to
//!   their devices when a card waits (`push`), and the web app they use
//!   (`web`, a component `serve` starts and stops).
//! - [`cli`]: the `control-stub` command line.
//! - `synth` (only with the `test-util` feature): a synthetic session with
//!   real signatures, for the certificate bundle's tests and benchmark.

#![forbid(unsafe_code)]

pub mod error;
pub mod pb;
pub mod names;
pub mod identity;
pub mod model;
pub mod machine;
pub mod lock;
pub mod link;
#[cfg(any(test, feature = "test-util"))]
pub mod fake;
pub mod store;
pub mod confirm;
pub mod batches;
pub mod series;
pub mod grpc_link;
pub mod trust;
pub mod lifecycle;
pub mod relay;
pub mod certificate;
pub mod bundle;
pub mod upkeep;
pub mod serve;
pub mod people;
pub mod cli;
#[cfg(any(test, feature = "test-util"))]
pub mod synth;

pub use certificate::{certificate, Certificate};
pub use confirm::SignatureVerifier;
pub use error::{Error, LinkError};
#[cfg(any(test, feature = "test-util"))]
pub use fake::{FakeLink, FakeVerifier};
pub use grpc_link::GrpcLink;
pub use lifecycle::{Lifecycle, StartRequest, Status, Transition};
pub use link::{
    Attachment, CloseSession, DropReportView, GatewayLink, OpenSession, Opened, ReportVerifier,
};
pub use lock::LockRule;
pub use model::{CloseReason, EndReason, LockMode, Mode, OpenCause, ProposalState, State};
pub use store::{BatchOutcome, Store};
