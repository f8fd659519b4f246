//! Roles on the control channel: what a certificate of the control CA may
//! do.
//!
//! Every certificate `control-stub init` issues carries its role as one more
//! DNS name in its subject alternative names, in a domain that can never be
//! a real one (`.invalid`, RFC 2606): the control plane's certificate
//! [`CONTROL_PLANE`], each gateway's [`GATEWAY`] (beside its gateway id).
//! A gateway takes `Gateway` calls (open, close, renew, decide) only from a
//! control-plane certificate, so the other member of the pair, whose
//! certificate comes from the same CA, cannot open or close sessions on it;
//! the control plane takes batches and proposals only from a gateway
//! certificate that also names the gateway id they claim.
//!
//! A DNS name rather than a custom extension: every verifier already checks
//! names (rustls-webpki's `verify_is_valid_for_subject_name` here), so the
//! check needs no certificate parser of its own, and `openssl x509 -text`
//! shows it plainly.

/// The control plane's role.
pub const CONTROL_PLANE: &str = "control-plane.role.talos.invalid";

/// A gateway's role.
pub const GATEWAY: &str = "gateway.role.talos.invalid";

/// The stable reason the control plane refuses a batch or a proposal with
/// when the client certificate does not name the gateway id it claims.
pub const CERTIFICATE_MISMATCH: &str = "certificate_mismatch";
