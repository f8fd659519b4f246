//! What can go wrong making a session CA or one of its leaves.

use std::time::Duration;

/// Why a session CA or a leaf could not be made.
///
/// Every variant that comes from a caller's input carries the offending
/// value. The text is for people; match on the variant, not the message.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CertError {
    /// The name is not a canonical DNS host name (empty, wildcard, IP
    /// literal, upper case, trailing dot, bad label, …).
    #[error("name {name:?} is not a host name: {reason}")]
    NotAHostName {
        /// The value as given.
        name: String,
        /// What is wrong with it.
        reason: &'static str,
    },

    /// The name is a host name, but not one this session's CA permits.
    #[error("{name:?} is not permitted by this session CA")]
    NotPermitted {
        /// The value as given.
        name: String,
    },

    /// A session or gateway id cannot go into the CA's subject.
    #[error("{field} {value:?} cannot name a session CA: {reason}")]
    BadIdentifier {
        /// `session_id` or `gateway_id`.
        field: &'static str,
        /// The value as given.
        value: String,
        /// What is wrong with it.
        reason: &'static str,
    },

    /// The requested CA lifetime is zero or longer than the maximum.
    #[error("session CA lifetime {lifetime:?} is outside 1s..={max:?}")]
    BadLifetime {
        /// The lifetime asked for.
        lifetime: Duration,
        /// [`MAX_CA_LIFETIME`](crate::MAX_CA_LIFETIME).
        max: Duration,
    },

    /// The gateway's clock gives a time a certificate cannot carry (before
    /// 1970, or so far ahead that the validity overflows).
    #[error("the gateway's clock is unusable for certificate validity: {0}")]
    Clock(&'static str),

    /// aws-lc could not generate a P-256 key (gateway fault).
    #[error("aws-lc could not generate a P-256 key")]
    KeyGeneration,

    /// rcgen could not encode or sign a certificate (gateway fault).
    #[error("could not build the certificate for {subject:?}: {source}")]
    Build {
        /// The CA's common name, or the leaf's name.
        subject: String,
        /// What rcgen reported.
        #[source]
        source: rcgen::Error,
    },

    /// What a predecessor process handed over is not a CA this crate made
    /// (a key that is not its certificate's, the wrong number of
    /// intermediates, a validity no certificate carries).
    #[error("the session CA handed over is unusable: {reason}")]
    Handover {
        /// What is wrong with it.
        reason: &'static str,
    },
}
