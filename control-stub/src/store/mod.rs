//! The control stub's store: one SQLite file, or one PostgreSQL database
//! shared by several `serve` replicas (`db.rs` says how the two are one
//! store).
//!
//! A SQLite file is created with mode 0600 (it holds the secret store), and an
//! existing file that others may read or write is refused. It runs in WAL
//! mode with `synchronous = FULL` (a recorded CA destruction survives a
//! power cut) and `secure_delete = ON` (a deleted or replaced secret value
//! is overwritten in the file, not just unlinked from the b-tree; the WAL is
//! checkpointed and truncated after every change to a secret, so no old
//! frame keeps it either — what the filesystem keeps of freed blocks is out
//! of reach).
//!
//! The schema is versioned (SQLite's `PRAGMA user_version`; a PostgreSQL
//! store's `schema_version` table) and created on first use (version 13).
//! An older SQLite file is upgraded in place: version 1 gains
//! `chain_state`, version 2 the Lock's tables and the attempts' `lock` and
//! `relay_public_key`, version 3 what a session's end under faults needs,
//! version 4 the states of an open in flight, version 5 the audit trail:
//! numbered reset step outcomes and the commands, and the members;
//! version 7 the sessions by source, version 8 the passthrough
//! destinations, version 9 the push subscriptions, version 10 the hard
//! stop, when each attempt began to run, and the state `failed`, version
//! 11 the batches and key bindings as signed, version 12 people and
//! their passkeys, version 13 the account's settings. A
//! PostgreSQL store begins at version 6 (the whole schema at once) and
//! takes the upgrades after it, which are written once for both — see
//! `schema.rs`:
//!
//! | table | one row per | columns |
//! |---|---|---|
//! | `egress` | name on the account's egress list (one account; the list is global) | `name` (canonical), `added_at` |
//! | `secrets` | secret of a tenant | `tenant`, `name`, `value` (BLOB, as given; no command prints it), `updated_at` |
//! | `gateways` | registered gateway | `id`, `public_key_hex`, `registered_at`, `instance` (its process last seen), `lease_ms`, `last_contact_at`, `last_error` |
//! | `sessions` | session | `id`, `tenant`, `mode`, `state`, `created_at`, `ended_at`, `end_reason`, `outcome`, `allow` (JSON: the names asked), `attach` (JSON: the attachments asked, no values), `sources` (JSON), `idle_timeout_seconds`, `idle_action`, `last_activity_at`, `stop_after_seconds` (the hard stop; NULL: none) |
//! | `attempts` | attempt of a session | `session_id`, `n` (from 1), `cause`, `started_at`, `ended_at`, `end_cause`, `allowlist` and `attachments` (JSON: what this attempt opened with), `lock` (JSON: the Lock rules sent at this open), `relay_public_key` (hex; NULL when none was sent), `passthrough` (JSON: the names opened as passthrough), `running_at` (when its open's answers made it run, which its compute counts from; NULL: it never ran), `lab_approvals` (1: opened with the account's lab setting on) |
//! | `ca_events` | CA a gateway made for an attempt | `session_id`, `attempt`, `gateway_id`, `digest`, `cert_pem`, `made_at`, `destroyed_at`, `destroy_reason` (set only when a verified drop report names this digest) |
//! | `drop_reports` | drop report a gateway returned | `session_id`, `attempt` (the attempt whose authority was dropped), `gateway_id`, `reason`, `ca_digest`, `secrets` (JSON), `signed` (the signed bytes), `received_at`, `verifier`, `ca_error`, `secrets_error` (NULL when that half checked out) |
//! | `reset_steps` | outcome of a reset step of an ended session (never replaced: a later outcome is a row beside it) | `session_id`, `step` (1–5), `n` (from 1, one more at each outcome recorded), `name`, `confirmed`, `response` (JSON), `error`, `at` |
//! | `account_settings` | setting of the account (`lab_approvals`, `web_origin`, `web_rp_id`) | `name`, `value`, `changed_at`, `changed_by` |
//! | `members` | member of the pair (`gateway add`) | `id`, `control` (`HOST:PORT` of its control listener), `added_at` |
//! | `session_sources` | source address of a session | `session_id`, `source` (as text; indexed: a start's check that its sources are no live session's) |
//! | `commands` | command or time-driven event that moved a session | `session_id`, `n` (from 1), `event` (the machine's), `requester` (`operator`, `approver`, `time`), `requested_by` (the operator's identity, the approver's name, or the time-driven cause), `attempt` (opened or ended, when one), `at` |
//! | `batches` | verified batch received | `gateway_id`, `seq`, `digest`, `received_at` |
//! | `connection_records` | connection record of a batch | `gateway_id`, `seq`, `idx` (position in the batch), `session_id` (from the record; NULL for `unknown_source`), `json` |
//! | `batch_rejections` | batch refused by the batch consumer | `gateway_id`, `seq`, `reason`, `at` |
//! | `chain_state` | gateway whose batches were accepted | `gateway_id`, `json` (talos-certs `ChainState`: last seq and recent digests) |
//! | `lock_rules` | Lock rule | `n` (never reused), `id` (`lock-N`), `destination` (canonical or `*`), `attachment`, `method`, `path_prefix` (empty: any), `mode`, `approvers` (JSON, sorted), `created_at` |
//! | `proposals` | proposal a gateway sent the relay | `proposal_id`, `gateway_id`, `session_id`, `attempt`, `rule`, `fields` (JSON: the talos-certs `Proposal`), `sentence`, `digest`, `state` (`pending`, `approved`, `declined`, `withdrawn`, `expired`), `approver`, `decided_at` (when it left `pending`), `created_at`, `expires_at` (the gateway's), `received_at`, `decision` (JSON: the signed envelope delivered), `outcome` (the gateway's answer: `released` or `refused`), `assertion` (JSON: the person's passkey assertion, when one signed), `answered_by` (a `first_use` proposal joined to the first card of the same session attempt and rule: that card's id; decided with it) |
//! | `signed_batches` | verified batch received, as signed (version 11 on: the bundles' evidence) | `gateway_id`, `seq`, `key_id`, `payload` (the signed bytes), `signature` |
//! | `key_bindings` | gateway signing key's binding under the control CA, as the member gave it (`Describe`) | `gateway_id`, `public_key_hex`, `binding` (JSON: talos-certs `KeyBinding`), `received_at` |
//! | `approvers` | approver of the approvals API | `name`, `token_sha256` (hex; the token itself is shown once and never stored), `created_at` |
//! | `push_subscriptions` | device a person subscribed to Web Push | `person`, `endpoint` (the push service's URL: a capability, never logged), `p256dh` (the device's P-256 key), `auth` (its 16-byte secret), `created_at`, `last_success_at`, `last_failure_at`, `last_failure` (a status or an error class) |
//!
//! Every change runs in one transaction ([`Store::write`]); a failing
//! operation changes nothing.
//!
//! # Layout
//!
//! This file only names the parts. One [`Store`] (and its [`Tx`] inside a
//! transaction); its methods stand with the tables they touch, one file
//! each, below the ones they all rest on:
//!
//! - `value`: the values that cross between the store and either
//!   database: parameters, rows, columns read.
//! - `write_lock`: the one write lock writers take turns under.
//! - `pg`: the PostgreSQL connection: its URL, TLS to another host, its
//!   session settings, its prepared statements, what its errors may say.
//! - `schema`: the schema version, each version's tables, the upgrade.
//! - `sqlite`: the SQLite file: created private, its pragmas, its schema.
//! - `db`: where a store lives ([`Db`]), [`Store`] and its transactions
//!   ([`Tx`]), and the statements every table runs through them, in the
//!   one dialect both databases take.
//! - `sessions`: sessions and their attempts.
//! - `reset`: the CAs, the drop reports and the reset steps.
//! - `secrets`: the secret store.
//! - `policy`: the egress list and the Lock's rules.
//! - `gateways`: the registered gateways and their keys.
//! - `batches`: batches, their connection records, refused batches, the
//!   chain positions.
//! - `approvals`: the approvers and the relay's proposals.
//! - `certificates`: issued certificates, written once.
//! - `commands`: who asked for each change of a session.
//! - `members`: the members of the pair and their control addresses.
//! - `push`: people's push subscriptions (Web Push), checked as a browser
//!   gives them.
//! - `evidence`: what a certificate bundle carries exactly as signed: the
//!   signed batches, the key bindings, the reports' envelopes.

mod value;
mod write_lock;
mod pg;
mod schema;
mod sqlite;
mod db;
mod sessions;
mod reset;
mod secrets;
mod policy;
mod gateways;
mod batches;
mod approvals;
mod certificates;
mod commands;
mod members;
mod push;
mod evidence;
mod people;
pub mod settings;

pub use approvals::ProposalRecord;
pub use batches::{
    BatchInfo, BatchOutcome, BatchRejection, ChainGap, ChainPosition, ConnectionRecord,
};
pub use certificates::IssuedCertificate;
pub use commands::{ClientCertificate, CommandRecord, Proof, Requester, RequesterKind};
pub use db::{now, Db, Store, Tx, DEFAULT_PATH};
pub use evidence::StoredReport;
pub use gateways::{ed25519_key, GatewayInfo, StartRecord};
pub use members::{Member, Unaddressed};
pub use people::{
    Challenge, ChallengePurpose, Enrolment, Passkey, Person, PersonInfo, PersonRemoved,
    SignedByPasskey, WebSession,
};
pub use push::{
    Endpoint, NewSubscription, PushSubscription, AUTH_LEN, MAX_ENDPOINT_LEN, MAX_SUBSCRIPTIONS,
    P256DH_LEN,
};
pub use reset::{CaEvent, CloseTask, DropReport, DueClose, ResetStep, StepOutcome};
pub use schema::{ddl_through, postgres_ddl, SCHEMA_VERSION};
pub use secrets::SecretInfo;
pub use sessions::{Attempt, Session};
pub use value::Value;
pub use write_lock::BUSY_TIMEOUT;
