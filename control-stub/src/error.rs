//! The control stub's errors: one enum, one stable snake_case code each.
//!
//! The code ([`Error::code`]) is the API: scripts and tests match on it, and
//! the CLI prints it as `error: <code>: <message>` (exit status 2). The
//! message is for people and may change.
//!
//! Where the spec page "Sandbox sessions" names an error, the code is the
//! spec's: `sandbox_request_invalid`, `sandbox_pause_unavailable`,
//! `sandbox_not_running`. Every other code is the control stub's own; the
//! spec names no error for those cases.
//!
//! | code | when |
//! |---|---|
//! | `sandbox_not_found` | no session has that id |
//! | `sandbox_request_invalid` | a start request is malformed: a bad tenant, source, attachment, or an attachment whose destination is not among the session's `--allow` names (spec) |
//! | `sandbox_destination_not_allowed` | an `--allow` name is not on the account's egress list (not named by the spec) |
//! | `sandbox_source_in_use` | a source address already names another session that has not ended |
//! | `sandbox_pause_unavailable` | a pause of a session in mode `agent` (spec) |
//! | `sandbox_not_running` | a pause or an interruption of a session that is not running (spec) |
//! | `sandbox_not_paused` | a resume of a session that is not paused |
//! | `sandbox_not_interrupted` | a recovery of a session that is not interrupted |
//! | `sandbox_ended` | any change to a session that has ended (also one whose reset is incomplete): a session that ended never comes back |
//! | `secret_not_found` | an attachment or `secret delete` names a secret the tenant does not have |
//! | `secret_value_invalid` | a secret value is empty, too long, or holds a byte a header cannot carry |
//! | `name_invalid` | a tenant, secret, destination or gateway name is not well formed |
//! | `egress_not_found` | `policy egress remove` of a name that is not on the list |
//! | `passthrough_conflict` | a passthrough destination with an attachment or a Lock rule: `policy lock add` naming a passthrough destination, `policy passthrough add` of a name a Lock rule names or a session not ended attaches a credential to, a start, resume or recovery whose attachment or rule names one. The gateway passes such a destination's connections on without seeing a request, so it could honour neither |
//! | `passthrough_not_found` | `policy passthrough remove` of a name that is not marked passthrough |
//! | `gateway_unreachable` | the gateways could not be reached (the link failed before they answered) |
//! | `gateway_refused` | a gateway answered with a refusal |
//! | `gateway_reply_invalid` | a gateway's answer does not hold together (a CA digest that is not the certificate's, a gateway answering twice, no gateway at all) |
//! | `gateway_key_conflict` | a gateway id is already registered with another public key |
//! | `gateway_not_found` | `gateway remove` of an id that is no member |
//! | `gateway_in_use` | `gateway remove` of a member a live session needs (it holds an authority of a session not over, or is owed a close) |
//! | `gateway_unaddressed` | `serve` found live sessions on a member that has no control address (`gateway add ID --control ADDR`, or `--gateway ID=ADDR`); it does not start |
//! | `batch_conflict` | a batch sequence number already recorded with another digest |
//! | `certificate_not_issued` | the session certificate cannot be issued: the session has not ended, or a reset step is not confirmed |
//! | `bundle_incomplete` | `certificate bundle` cannot show what the certificate rests on: a batch it needs was accepted before batches were kept as signed, a member has no registered key, or `plane.key` is not the key that signed the certificate |
//! | `lock_rule_invalid` | a `policy lock add` rule is malformed: a destination that is neither a name nor `*`, a method that is not an HTTP token, a path prefix not starting with `/`, no approver, a bad approver name |
//! | `lock_rule_not_found` | `policy lock remove` of an id no rule has |
//! | `approval_not_found` | no proposal has that id |
//! | `approval_not_pending` | a decision on a proposal already approved, declined, withdrawn (its session paused, was interrupted or ended) or expired |
//! | `approver_not_listed` | the approver is not among the proposal's approvers, or no longer among its rule's (or the rule was removed); nothing changes |
//! | `approver_not_enrolled` | `policy lock add` names an approver who holds no passkey (`people enroll NAME --role approver`, then the link): nobody could decide its cards |
//! | `person_not_found` | `people remove` of a name that is no person |
//! | `person_role_conflict` | `people enroll` of a person with another role than the one they hold (remove them and enrol them again to change it) |
//! | `enrolment_unknown` | an enrolment link whose token no enrolment has (mistyped, or its person was removed) |
//! | `enrolment_expired` | an enrolment link past its 15 minutes |
//! | `enrolment_used` | an enrolment link already used (each is good once) |
//! | `challenge_invalid` | a passkey ceremony's challenge that was never issued, was used already, is past its 2 minutes, or was issued for another purpose, person or command |
//! | `passkey_refused` | WebAuthn refused the passkey's registration or assertion; `reason` is `talos_certs::webauthn`'s stable name (`challenge_mismatch`, `user_not_verified`, `unknown_credential`, …) |
//! | `passkey_exists` | an enrolment of a credential id already stored (the same authenticator twice) |
//! | `sign_in_limited` | too many sign-in attempts from one address, or in all, in the last 15 minutes (HTTP 429, `Retry-After`) |
//! | `challenges_full` | as many passkey challenges are outstanding as the store keeps (HTTP 429) |
//! | `not_signed_in` | a web app request without a live session cookie (HTTP 401) |
//! | `not_permitted` | a web app request the person's role does not allow (HTTP 403) |
//! | `web_config_invalid` | a web app setting is malformed: an origin that is not `https://NAME[:PORT]` (a lower-case DNS name), an rp id the origin's host is not under, a `--web-*` flag without `--web-listen` or the reverse |
//! | `relay_key_invalid` | the relay's signing key (`<control-dir>/relay.key`) cannot be read or made, or deciding needs it and no `--control-dir` was given |
//! | `proposal_invalid` | a gateway's proposal does not hold together: a field out of bounds, a sentence or digest that is not the one its fields give, a rule or approvers that are not the rule's (gRPC `INVALID_ARGUMENT`) |
//! | `proposal_stale` | a proposal for a session that is not running at that attempt, from a gateway that holds no authority for it (gRPC `FAILED_PRECONDITION`) |
//! | `proposal_conflict` | a proposal id already received with another digest (gRPC `ALREADY_EXISTS`) |
//! | `public_roots_invalid` | `sandbox trust` of a session listing a passthrough name: the public roots file holds no certificate, a certificate that does not parse, a private key or another PEM block |
//! | `io_failed` | reading a secret value from standard input or a file failed, or the public roots file (`sandbox trust`; also: no system bundle found) |
//! | `push_subscription_invalid` | a device's push subscription is malformed: an endpoint that is not an `https` URL with a host (no user name, at most 2,048 bytes), a `p256dh` that is no uncompressed P-256 point, an `auth` that is not 16 bytes, all base64url; or an endpoint on a host push is not allowed to reach (`--push-host`) |
//! | `push_subscriptions_full` | a person already holds the most push subscriptions one person may (10): one must go first |
//! | `push_config_invalid` | a push setting is malformed: a VAPID contact that is neither `mailto:` nor an `https` URL, a push host pattern that is no DNS name, IP address or `*.` and a name, a CA file without a certificate |
//! | `store_failed` | the SQLite store failed, or its file is unsafe (readable by others) or from a newer version |

use std::fmt;

/// Everything a control stub operation can fail with.
///
/// No variant carries a secret value: errors name secrets by name.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("no session {id}")]
    SandboxNotFound { id: String },
    #[error("{reason}")]
    SandboxRequestInvalid { reason: String },
    #[error("{name} is not on the account's egress list")]
    DestinationNotAllowed { name: String },
    #[error("source {source_addr} already belongs to session {session_id}")]
    SourceInUse {
        source_addr: String,
        session_id: String,
    },
    #[error("session {id} is in mode agent, and only a session in mode commands can pause")]
    PauseUnavailable { id: String },
    #[error("session {id} is {state}, not running")]
    NotRunning { id: String, state: &'static str },
    #[error("session {id} is {state}, not paused")]
    NotPaused { id: String, state: &'static str },
    #[error("session {id} is {state}, not interrupted")]
    NotInterrupted { id: String, state: &'static str },
    #[error("session {id} has ended ({state}); a session that ended never comes back")]
    Ended { id: String, state: &'static str },
    #[error("tenant {tenant} has no secret {name}")]
    SecretNotFound { tenant: String, name: String },
    #[error("secret {name}: {reason}")]
    SecretValueInvalid { name: String, reason: String },
    #[error("{what} {got:?}: {reason}")]
    NameInvalid {
        what: &'static str,
        got: String,
        reason: String,
    },
    #[error("{name} is not on the egress list")]
    EgressNotFound { name: String },
    #[error("{destination} {what}")]
    PassthroughConflict { destination: String, what: String },
    #[error("{name} is not marked passthrough")]
    PassthroughNotFound { name: String },
    #[error("{0}")]
    Link(#[from] LinkError),
    #[error("gateway {gateway_id}: {reason}")]
    GatewayReplyInvalid { gateway_id: String, reason: String },
    #[error("gateway {gateway_id} is already registered with another public key")]
    GatewayKeyConflict { gateway_id: String },
    #[error("no member {gateway_id}")]
    GatewayNotFound { gateway_id: String },
    #[error("member {gateway_id} is needed by {sessions} live sessions (first: {first}): end them or let its closes be confirmed first")]
    GatewayInUse {
        gateway_id: String,
        sessions: u64,
        first: String,
    },
    #[error("{0}")]
    GatewayUnaddressed(String),
    #[error("gateway {gateway_id} batch {seq} was already recorded with digest {recorded}")]
    BatchConflict {
        gateway_id: String,
        seq: u64,
        recorded: String,
    },
    #[error("session {id}: {reason}")]
    CertificateNotIssued { id: String, reason: String },
    #[error("session {id}: no bundle: {reason}")]
    BundleIncomplete { id: String, reason: String },
    #[error("{reason}")]
    LockRuleInvalid { reason: String },
    #[error("no Lock rule {id}")]
    LockRuleNotFound { id: String },
    #[error("no proposal {id}")]
    ApprovalNotFound { id: String },
    #[error("proposal {id} is {state}, not pending: it can no longer be decided")]
    ApprovalNotPending { id: String, state: &'static str },
    #[error(
        "proposal {id} is the same first use as card {card}, and is decided with it: decide {card}"
    )]
    ApprovalJoined { id: String, card: String },
    #[error("{approver} is not listed to decide proposal {id}")]
    ApproverNotListed { id: String, approver: String },
    #[error("approver {name} has no passkey enrolled, so nobody of that name could decide the rule's cards: control-stub people enroll {name} --role approver, and have them open the link")]
    ApproverNotEnrolled { name: String },
    #[error("no person {name}")]
    PersonNotFound { name: String },
    #[error("{name} is an {role}, not an {asked}: to change a role, remove the person and enrol them again")]
    PersonRoleConflict {
        name: String,
        role: &'static str,
        asked: &'static str,
    },
    #[error("no enrolment has this link: ask for a new one")]
    EnrolmentUnknown,
    #[error("this enrolment link expired at {expired_at}: ask for a new one")]
    EnrolmentExpired { expired_at: String },
    #[error("this enrolment link was used at {used_at}: each link is good once")]
    EnrolmentUsed { used_at: String },
    #[error("challenge: {reason}")]
    ChallengeInvalid { reason: String },
    #[error("passkey refused ({reason}): {detail}")]
    PasskeyRefused {
        reason: &'static str,
        detail: String,
    },
    #[error("this passkey is enrolled already")]
    PasskeyExists,
    #[error("too many sign-in attempts {scope}: try again in {retry_after_secs} s")]
    SignInLimited {
        scope: &'static str,
        retry_after_secs: u64,
    },
    #[error(
        "{outstanding} passkey challenges are outstanding, the most kept: try again in a minute"
    )]
    ChallengesFull { outstanding: u64 },
    #[error("not signed in (or the session is over): sign in with your passkey")]
    NotSignedIn,
    #[error("web app: {reason}")]
    WebConfigInvalid { reason: String },
    #[error("{what} needs the role {needs}")]
    NotPermitted {
        what: &'static str,
        needs: &'static str,
    },
    #[error("relay key: {reason}")]
    RelayKeyInvalid { reason: String },
    #[error("approvals approve|decline --as decides with no person's passkey, which only the account's lab setting allows (control-stub policy lab-approvals on); otherwise a person decides in the web app with their passkey")]
    LabApprovalsOff,
    #[error("proposal: {reason}")]
    ProposalInvalid { reason: String },
    #[error("proposal: {reason}")]
    ProposalStale { reason: String },
    #[error("proposal {id} was already received with another digest")]
    ProposalConflict { id: String },
    #[error("public roots file {path}: {reason}")]
    PublicRootsInvalid { path: String, reason: String },
    #[error("push subscription: {reason}")]
    PushSubscriptionInvalid { reason: String },
    #[error("{person} already holds {limit} push subscriptions; remove one first")]
    PushSubscriptionsFull { person: String, limit: usize },
    #[error("push: {reason}")]
    PushConfigInvalid { reason: String },
    #[error("{what}: {reason}")]
    Io { what: String, reason: String },
    #[error("store: {0}")]
    Store(String),
}

impl Error {
    /// The stable snake_case code of this error.
    pub fn code(&self) -> &'static str {
        match self {
            Error::SandboxNotFound { .. } => "sandbox_not_found",
            Error::SandboxRequestInvalid { .. } => "sandbox_request_invalid",
            Error::DestinationNotAllowed { .. } => "sandbox_destination_not_allowed",
            Error::SourceInUse { .. } => "sandbox_source_in_use",
            Error::PauseUnavailable { .. } => "sandbox_pause_unavailable",
            Error::NotRunning { .. } => "sandbox_not_running",
            Error::NotPaused { .. } => "sandbox_not_paused",
            Error::NotInterrupted { .. } => "sandbox_not_interrupted",
            Error::Ended { .. } => "sandbox_ended",
            Error::SecretNotFound { .. } => "secret_not_found",
            Error::SecretValueInvalid { .. } => "secret_value_invalid",
            Error::NameInvalid { .. } => "name_invalid",
            Error::EgressNotFound { .. } => "egress_not_found",
            Error::PassthroughConflict { .. } => "passthrough_conflict",
            Error::PassthroughNotFound { .. } => "passthrough_not_found",
            Error::Link(e) => e.code(),
            Error::GatewayReplyInvalid { .. } => "gateway_reply_invalid",
            Error::GatewayKeyConflict { .. } => "gateway_key_conflict",
            Error::GatewayNotFound { .. } => "gateway_not_found",
            Error::GatewayInUse { .. } => "gateway_in_use",
            Error::GatewayUnaddressed(_) => "gateway_unaddressed",
            Error::BatchConflict { .. } => "batch_conflict",
            Error::CertificateNotIssued { .. } => "certificate_not_issued",
            Error::BundleIncomplete { .. } => "bundle_incomplete",
            Error::LockRuleInvalid { .. } => "lock_rule_invalid",
            Error::LockRuleNotFound { .. } => "lock_rule_not_found",
            Error::ApprovalNotFound { .. } => "approval_not_found",
            Error::ApprovalNotPending { .. } => "approval_not_pending",
            Error::ApprovalJoined { .. } => "approval_joined",
            Error::ApproverNotListed { .. } => "approver_not_listed",
            Error::ApproverNotEnrolled { .. } => "approver_not_enrolled",
            Error::PersonNotFound { .. } => "person_not_found",
            Error::PersonRoleConflict { .. } => "person_role_conflict",
            Error::EnrolmentUnknown => "enrolment_unknown",
            Error::EnrolmentExpired { .. } => "enrolment_expired",
            Error::EnrolmentUsed { .. } => "enrolment_used",
            Error::ChallengeInvalid { .. } => "challenge_invalid",
            Error::PasskeyRefused { .. } => "passkey_refused",
            Error::PasskeyExists => "passkey_exists",
            Error::SignInLimited { .. } => "sign_in_limited",
            Error::ChallengesFull { .. } => "challenges_full",
            Error::NotSignedIn => "not_signed_in",
            Error::NotPermitted { .. } => "not_permitted",
            Error::WebConfigInvalid { .. } => "web_config_invalid",
            Error::RelayKeyInvalid { .. } => "relay_key_invalid",
            Error::LabApprovalsOff => "lab_approvals_off",
            Error::ProposalInvalid { .. } => "proposal_invalid",
            Error::ProposalStale { .. } => "proposal_stale",
            Error::ProposalConflict { .. } => "proposal_conflict",
            Error::PublicRootsInvalid { .. } => "public_roots_invalid",
            Error::PushSubscriptionInvalid { .. } => "push_subscription_invalid",
            Error::PushSubscriptionsFull { .. } => "push_subscriptions_full",
            Error::PushConfigInvalid { .. } => "push_config_invalid",
            Error::Io { .. } => "io_failed",
            Error::Store(_) => "store_failed",
        }
    }

    /// The form the CLI prints: `<code>: <message>`.
    pub fn display_with_code(&self) -> impl fmt::Display + '_ {
        WithCode(self)
    }

    pub(crate) fn invalid(reason: impl Into<String>) -> Error {
        Error::SandboxRequestInvalid {
            reason: reason.into(),
        }
    }
}

/// Why a call to the gateways over the link failed, before or instead of
/// an answer.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum LinkError {
    /// No answer: the gateways could not be reached or did not answer in
    /// time.
    #[error("gateways unreachable: {0}")]
    Unreachable(String),
    /// A gateway answered, and refused.
    #[error("gateway {gateway_id} refused: {reason}")]
    Refused { gateway_id: String, reason: String },
    /// A gateway answered something that does not parse.
    #[error("gateway {gateway_id} answered something unreadable: {reason}")]
    Invalid { gateway_id: String, reason: String },
}

impl LinkError {
    /// The stable code, as in [`Error::code`].
    pub fn code(&self) -> &'static str {
        match self {
            LinkError::Unreachable(_) => "gateway_unreachable",
            LinkError::Refused { .. } => "gateway_refused",
            LinkError::Invalid { .. } => "gateway_reply_invalid",
        }
    }
}

struct WithCode<'a>(&'a Error);

impl fmt::Display for WithCode<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.0.code(), self.0)
    }
}

impl From<serde_json::Error> for Error {
    fn from(e: serde_json::Error) -> Error {
        Error::Store(format!("a stored JSON column does not parse: {e}"))
    }
}
