//! The closed set of reasons the gateway refuses something.
//!
//! Each reason is one variant with one stable snake_case name, used word for
//! word in records, metric labels, logs, API errors and HTTP answers, so an
//! agent and an auditor can tell a policy refusal from a network fault.
//!
//! Each reason also carries how the gateway answers it once TLS is up:
//! its HTTP status, its gRPC code and its sentence for people. Beside the
//! reason, every refusal records a cause: a fixed word from the refusing
//! stage's own cause enum (declared with [`causes!`]), never a value from
//! the request. `docs/records.md` lists every one.

use std::fmt;

/// The response header that carries a refusal's stable reason. Only the
/// gateway sets it: a destination's copy never reaches the session.
pub const REFUSAL_HEADER: &str = "hangar-refusal";

/// A refusal: the reason, and the fixed cause inside it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Refused {
    pub reason: Refusal,
    /// The `as_str()` of the refusing stage's cause.
    pub cause: &'static str,
    /// When trying again can succeed, if the gateway knows (a rate).
    pub retry_after: Option<std::time::Duration>,
}

impl Refused {
    pub const fn new(reason: Refusal, cause: &'static str) -> Refused {
        Refused {
            reason,
            cause,
            retry_after: None,
        }
    }
}

/// Declares a closed set of stable words (a stage's causes, a metric's
/// label values): an enum, its `ALL`, and a stable `as_str()`.
macro_rules! causes {
    (
        $(#[$meta:meta])*
        $vis:vis enum $name:ident {
            $( $(#[$vmeta:meta])* $variant:ident => $word:literal, )+
        }
    ) => {
        $(#[$meta])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        $vis enum $name {
            $( $(#[$vmeta])* $variant, )+
        }

        impl $name {
            /// Every cause of this stage.
            pub const ALL: &'static [$name] = &[$($name::$variant),+];

            /// The stable word: never change one, only add.
            pub const fn as_str(self) -> &'static str {
                match self {
                    $($name::$variant => $word,)+
                }
            }
        }
    };
}
pub(crate) use causes;

/// Why the gateway refused a connection or a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Refusal {
    /// The connection was not a TLS handshake.
    NotTls,
    /// The TLS hello named no server.
    NoServerName,
    /// The hello carried an encrypted client hello (extension 0xfe0d).
    EncryptedClientHello,
    /// The name is not on the session's allowlist.
    NotOnAllowlist,
    /// The connection came from an address that is no session's.
    UnknownSource,
    /// The name resolved to an address inside a private network.
    ResolvesInternal,
    /// A request named a host other than the host of its connection.
    HostMismatch,
    /// A request asked to change protocol.
    UpgradeRefused,
    /// A named person declined, or no decision came in time (or could not
    /// come: the approval relay refused the proposal, or did not take it).
    ApprovalDeclined,
    /// The approval was withdrawn because the session paused or ended.
    ApprovalWithdrawn,
    /// A gRPC request went to a destination that answered over HTTP/1.1.
    GrpcNeedsHttp2,
    /// The gateway could not reach the destination.
    UpstreamFailed,
    /// The session ended while the connection was open.
    SessionEnded,
    /// The session is at one of the bounds of its share of the gateway
    /// (`session::share`): beyond the spec's thirteen.
    SessionLimit,
}

impl Refusal {
    /// Every reason, in the order the spec lists them, then the gateway's
    /// own.
    pub const ALL: [Refusal; 14] = [
        Refusal::NotTls,
        Refusal::NoServerName,
        Refusal::EncryptedClientHello,
        Refusal::NotOnAllowlist,
        Refusal::UnknownSource,
        Refusal::ResolvesInternal,
        Refusal::HostMismatch,
        Refusal::UpgradeRefused,
        Refusal::ApprovalDeclined,
        Refusal::ApprovalWithdrawn,
        Refusal::GrpcNeedsHttp2,
        Refusal::UpstreamFailed,
        Refusal::SessionEnded,
        Refusal::SessionLimit,
    ];

    /// The stable name: never change one, only add.
    pub const fn as_str(self) -> &'static str {
        match self {
            Refusal::NotTls => "not_tls",
            Refusal::NoServerName => "no_server_name",
            Refusal::EncryptedClientHello => "encrypted_client_hello",
            Refusal::NotOnAllowlist => "not_on_allowlist",
            Refusal::UnknownSource => "unknown_source",
            Refusal::ResolvesInternal => "resolves_internal",
            Refusal::HostMismatch => "host_mismatch",
            Refusal::UpgradeRefused => "upgrade_refused",
            Refusal::ApprovalDeclined => "approval_declined",
            Refusal::ApprovalWithdrawn => "approval_withdrawn",
            Refusal::GrpcNeedsHttp2 => "grpc_needs_http2",
            Refusal::UpstreamFailed => "upstream_failed",
            Refusal::SessionEnded => "session_ended",
            Refusal::SessionLimit => "session_limit",
        }
    }

    /// The HTTP status of the gateway's answer, for a refusal after the
    /// TLS handshake.
    pub const fn http_status(self) -> u16 {
        match self {
            Refusal::HostMismatch => 421,
            Refusal::GrpcNeedsHttp2 | Refusal::UpstreamFailed => 502,
            Refusal::SessionEnded => 503,
            // Too Many Requests: the session's own doing, and it passes.
            Refusal::SessionLimit => 429,
            _ => 403,
        }
    }

    /// The gRPC status code of the gateway's answer to a gRPC request.
    pub const fn grpc_code(self) -> u16 {
        match self {
            // UNIMPLEMENTED: the destination cannot carry gRPC.
            Refusal::GrpcNeedsHttp2 => 12,
            // UNAVAILABLE: a network or lifecycle failure, not a policy.
            Refusal::UpstreamFailed | Refusal::SessionEnded => 14,
            // RESOURCE_EXHAUSTED: a per-session bound.
            Refusal::SessionLimit => 8,
            // PERMISSION_DENIED: a policy refusal.
            _ => 7,
        }
    }

    /// The sentence the gateway's answer carries, for people.
    pub const fn message(self) -> &'static str {
        match self {
            Refusal::HostMismatch => "the request names a host other than the host of its connection",
            Refusal::UpgradeRefused => "the gateway passes on only requests that it can read; protocol upgrades and CONNECT are refused",
            Refusal::GrpcNeedsHttp2 => "a gRPC request went to a destination that answered over HTTP/1.1",
            Refusal::UpstreamFailed => "the gateway could not reach the destination",
            Refusal::ApprovalDeclined => "a named person declined, or no decision came: none within five minutes, or the approval relay refused the proposal or could not be reached",
            Refusal::ApprovalWithdrawn => "the approval was withdrawn because the session paused or ended",
            Refusal::SessionEnded => "the session ended",
            Refusal::SessionLimit => "the session is at a bound of its share of the gateway (open connections, handshakes, held requests, pending proposals or proposal rate); retry once something of it has finished",
            _ => "refused by the gateway",
        }
    }

    /// The reason with this stable name, if any.
    pub fn from_name(name: &str) -> Option<Refusal> {
        Refusal::ALL.into_iter().find(|r| r.as_str() == name)
    }
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl serde::Serialize for Refusal {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_are_snake_case() {
        for r in Refusal::ALL {
            assert_eq!(Refusal::from_name(r.as_str()), Some(r));
            assert!(r
                .as_str()
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_'));
        }
        assert_eq!(Refusal::from_name("allowed"), None);
    }
}
