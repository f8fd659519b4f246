//! What the control plane does for people — approvers and operators —
//! as opposed to gateways. `docs/people.md` says it for people.
//!
//! # Layout
//!
//! Each module depends only on those above it.
//!
//! - [`rp`]: the relying party (the web app's origin and rp id) and the
//!   pieces every ceremony uses: random tokens and their hashes,
//!   base64url, times.
//! - [`accounts`]: who the people are: `people enroll` (a person and a
//!   one-time enrolment link), `people list`, `people remove`.
//! - [`sessions`]: web sessions: the cookie, its life and rotation.
//! - [`ceremony`]: the passkey ceremonies — enrolment and sign-in — their
//!   challenges, and the bound on sign-in attempts.
//! - [`signed`]: what a person signs beyond sign-in: a decision on a card,
//!   Revoke All on a session; each verified and recorded with what it
//!   authorised.
//! - [`text`]: a card's text made safe to show: invisible, direction-
//!   changing and look-alike characters made visible.
//! - [`push`]: Web Push to an approver's devices when a card waits
//!   (RFC 8030, RFC 8291, RFC 8292): the VAPID identity's use, the
//!   message encryption, the bounded queue and its sender.
//! - [`web`] (a folder): the web app people use: its HTTPS listener (a
//!   component with explicit bind, start and stop), its pages and assets,
//!   its JSON API and the live card stream.

pub mod rp;
pub mod accounts;
pub mod sessions;
pub mod ceremony;
pub mod signed;
pub mod text;
pub mod push;
pub mod open;
pub mod web;
