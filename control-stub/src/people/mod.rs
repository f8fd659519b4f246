//! What the control plane does for people — approvers and operators —
//! as opposed to gateways.
//!
//! - [`push`]: Web Push to an approver's devices when a card waits
//!   (RFC 8030, RFC 8291, RFC 8292): the VAPID identity's use, the
//!   message encryption, the bounded queue and its sender.

pub mod push;
