//! The contract between the TALOS gateway and its control plane: the rules
//! both sides keep, in one place, so that the control plane refuses at the
//! start of a session what the gateway would refuse when it opens, and the
//! gateway's two entry points (a static session in its config, the
//! `OpenSession` RPC) refuse the same drafts.
//!
//! - [`name`]: destination names, one canonical form, never an IP literal.
//! - [`id`]: ids (sessions, gateways, Lock rules, approvers) and tenant names.
//! - [`source`]: session source addresses, IPv4-mapped IPv6 as IPv4.
//! - [`secret`]: bounds on secret names and values (never their storage).
//! - [`attach`]: `SECRET=destination:header[:scheme]` and the headers an
//!   attachment may not set.
//! - [`path`]: request paths as destinations route them: the canonical
//!   form the gateway forwards and the lenient routing key Lock rules match.
//! - [`lock`]: Lock rules: ids, destinations, methods, path prefixes, modes,
//!   approvers; and how a rule matches a request.
//! - [`spec`]: a session draft checked into a [`spec::SessionSpec`], the
//!   error naming the field.
//! - [`role`]: the roles a control-channel certificate carries (control
//!   plane, gateway).
//! - [`pb`]: the control channel's messages and services, compiled once
//!   from `proto/control.proto`.
//! - [`sync`]: locks that outlive a panic elsewhere.
//! - `cases` (feature `cases`): the tables both sides' tests run: session
//!   drafts for every entry point, and requests under a Lock rule for the
//!   gateway and the approval relay.
//!
//! It depends on neither the gateway nor the control plane; both depend on
//! it.

#![forbid(unsafe_code)]

pub mod name;
pub mod id;
pub mod source;
pub mod secret;
pub mod attach;
pub mod path;
pub mod lock;
pub mod spec;
pub mod role;
pub mod pb;
pub mod sync;
#[cfg(any(test, feature = "cases"))]
pub mod cases;

pub use spec::{SessionDraft, SessionSpec, SpecError};
