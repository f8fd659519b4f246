//! The schema: its version, the tables of each version, and the upgrade
//! of an older file in place.

use std::path::Path;

use rusqlite::{Connection, TransactionBehavior};

use super::write_lock;
use crate::error::Error;

/// The schema version this code writes (`PRAGMA user_version`).
pub const SCHEMA_VERSION: i64 = 14;

const SCHEMA_V1: &str = r#"
CREATE TABLE egress (
    name TEXT PRIMARY KEY NOT NULL,
    added_at TEXT NOT NULL
);
CREATE TABLE secrets (
    tenant TEXT NOT NULL,
    name TEXT NOT NULL,
    value BLOB NOT NULL,
    updated_at TEXT NOT NULL,
    PRIMARY KEY (tenant, name)
);
CREATE TABLE gateways (
    id TEXT PRIMARY KEY NOT NULL,
    public_key_hex TEXT NOT NULL,
    registered_at TEXT NOT NULL
);
CREATE TABLE sessions (
    id TEXT PRIMARY KEY NOT NULL,
    tenant TEXT NOT NULL,
    mode TEXT NOT NULL CHECK (mode IN ('agent', 'commands')),
    state TEXT NOT NULL
        CHECK (state IN ('running', 'paused', 'interrupted', 'ended', 'reset_incomplete')),
    created_at TEXT NOT NULL,
    ended_at TEXT,
    end_reason TEXT,
    outcome TEXT,
    allow TEXT NOT NULL,
    attach TEXT NOT NULL,
    sources TEXT NOT NULL
);
CREATE TABLE attempts (
    session_id TEXT NOT NULL REFERENCES sessions (id),
    n INTEGER NOT NULL CHECK (n >= 1),
    cause TEXT NOT NULL CHECK (cause IN ('launch', 'resume', 'recovery')),
    started_at TEXT NOT NULL,
    ended_at TEXT,
    end_cause TEXT,
    allowlist TEXT NOT NULL,
    attachments TEXT NOT NULL,
    PRIMARY KEY (session_id, n)
);
CREATE TABLE ca_events (
    session_id TEXT NOT NULL,
    attempt INTEGER NOT NULL,
    gateway_id TEXT NOT NULL,
    digest TEXT NOT NULL,
    cert_pem TEXT NOT NULL,
    made_at TEXT NOT NULL,
    destroyed_at TEXT,
    destroy_reason TEXT,
    PRIMARY KEY (session_id, attempt, gateway_id),
    FOREIGN KEY (session_id, attempt) REFERENCES attempts (session_id, n)
);
CREATE TABLE drop_reports (
    session_id TEXT NOT NULL,
    attempt INTEGER NOT NULL,
    gateway_id TEXT NOT NULL,
    reason TEXT NOT NULL,
    ca_digest TEXT NOT NULL,
    secrets TEXT NOT NULL,
    signed BLOB NOT NULL,
    received_at TEXT NOT NULL,
    verifier TEXT NOT NULL,
    ca_error TEXT,
    secrets_error TEXT,
    FOREIGN KEY (session_id, attempt) REFERENCES attempts (session_id, n)
);
CREATE INDEX drop_reports_by_attempt ON drop_reports (session_id, attempt);
CREATE TABLE reset_steps (
    session_id TEXT NOT NULL REFERENCES sessions (id),
    step INTEGER NOT NULL CHECK (step BETWEEN 1 AND 5),
    name TEXT NOT NULL,
    confirmed INTEGER NOT NULL CHECK (confirmed IN (0, 1)),
    response TEXT NOT NULL,
    error TEXT,
    at TEXT NOT NULL,
    PRIMARY KEY (session_id, step)
);
CREATE TABLE batches (
    gateway_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    digest TEXT NOT NULL,
    received_at TEXT NOT NULL,
    PRIMARY KEY (gateway_id, seq)
);
CREATE TABLE connection_records (
    gateway_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    idx INTEGER NOT NULL,
    session_id TEXT,
    json TEXT NOT NULL,
    PRIMARY KEY (gateway_id, seq, idx),
    FOREIGN KEY (gateway_id, seq) REFERENCES batches (gateway_id, seq)
);
CREATE INDEX connection_records_by_session ON connection_records (session_id);
CREATE TABLE batch_rejections (
    gateway_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    reason TEXT NOT NULL,
    at TEXT NOT NULL
);
"#;

/// Version 2: the batch consumer's chain position per gateway, updated in
/// the transaction that records each accepted batch.
const SCHEMA_V2: &str = r#"
CREATE TABLE chain_state (
    gateway_id TEXT PRIMARY KEY NOT NULL,
    json TEXT NOT NULL
);
"#;

/// Version 3: the Lock's rules, the relay's proposals, the approvals API's
/// approvers, and what each attempt opened with of the Lock.
const SCHEMA_V3: &str = r#"
CREATE TABLE lock_rules (
    n INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT UNIQUE NOT NULL,
    destination TEXT NOT NULL,
    attachment TEXT NOT NULL,
    method TEXT NOT NULL,
    path_prefix TEXT NOT NULL,
    mode TEXT NOT NULL CHECK (mode IN ('first_use', 'every_request')),
    approvers TEXT NOT NULL,
    created_at TEXT NOT NULL
);
CREATE TABLE proposals (
    proposal_id TEXT PRIMARY KEY NOT NULL,
    gateway_id TEXT NOT NULL,
    session_id TEXT NOT NULL REFERENCES sessions (id),
    attempt INTEGER NOT NULL,
    rule TEXT NOT NULL,
    fields TEXT NOT NULL,
    sentence TEXT NOT NULL,
    digest TEXT NOT NULL,
    state TEXT NOT NULL
        CHECK (state IN ('pending', 'approved', 'declined', 'withdrawn', 'expired')),
    approver TEXT,
    decided_at TEXT,
    created_at TEXT NOT NULL,
    expires_at TEXT NOT NULL,
    received_at TEXT NOT NULL,
    decision TEXT,
    outcome TEXT
);
CREATE INDEX proposals_by_session ON proposals (session_id);
CREATE INDEX proposals_by_state ON proposals (state);
CREATE TABLE approvers (
    name TEXT PRIMARY KEY NOT NULL,
    token_sha256 TEXT UNIQUE NOT NULL,
    created_at TEXT NOT NULL
);
ALTER TABLE attempts ADD COLUMN lock TEXT NOT NULL DEFAULT '[]';
ALTER TABLE attempts ADD COLUMN relay_public_key TEXT;
"#;

/// Version 4: a session's end no single failure can undo. The `stopping`
/// state (the sessions table is rebuilt: SQLite cannot change a CHECK);
/// each session's idle timeout and last activity; each gateway's process
/// instance and last contact; each CA's making instance; drop reports'
/// instance and whether they came in a reply or in the batch chain; the
/// closes still owed (`close_tasks`); start reports; connection records
/// named by process and number (a record sealed twice is kept once); the
/// sessions a refused batch named; issued certificates.
const SCHEMA_V4: &str = r#"
CREATE TABLE sessions_v4 (
    id TEXT PRIMARY KEY NOT NULL,
    tenant TEXT NOT NULL,
    mode TEXT NOT NULL CHECK (mode IN ('agent', 'commands')),
    state TEXT NOT NULL
        CHECK (state IN ('running', 'paused', 'interrupted', 'stopping', 'ended',
                         'reset_incomplete')),
    created_at TEXT NOT NULL,
    ended_at TEXT,
    end_reason TEXT,
    outcome TEXT,
    allow TEXT NOT NULL,
    attach TEXT NOT NULL,
    sources TEXT NOT NULL,
    idle_timeout_seconds INTEGER,
    idle_action TEXT CHECK (idle_action IN ('end', 'pause')),
    last_activity_at TEXT
);
INSERT INTO sessions_v4 (id, tenant, mode, state, created_at, ended_at, end_reason, outcome,
                         allow, attach, sources, last_activity_at)
    SELECT id, tenant, mode, state, created_at, ended_at, end_reason, outcome,
           allow, attach, sources, created_at FROM sessions;
DROP TABLE sessions;
ALTER TABLE sessions_v4 RENAME TO sessions;
ALTER TABLE gateways ADD COLUMN instance TEXT;
ALTER TABLE gateways ADD COLUMN lease_ms INTEGER;
ALTER TABLE gateways ADD COLUMN last_contact_at TEXT;
ALTER TABLE gateways ADD COLUMN last_error TEXT;
ALTER TABLE ca_events ADD COLUMN instance TEXT;
ALTER TABLE ca_events ADD COLUMN destroy_report TEXT;
ALTER TABLE drop_reports ADD COLUMN instance TEXT;
ALTER TABLE drop_reports ADD COLUMN via TEXT NOT NULL DEFAULT 'reply';
ALTER TABLE drop_reports ADD COLUMN batch_seq INTEGER;
CREATE TABLE close_tasks (
    session_id TEXT NOT NULL REFERENCES sessions (id),
    attempt INTEGER NOT NULL,
    gateway_id TEXT NOT NULL,
    reason TEXT NOT NULL,
    created_at TEXT NOT NULL,
    tries INTEGER NOT NULL DEFAULT 0,
    next_at TEXT NOT NULL,
    last_error TEXT,
    confirmed_at TEXT,
    confirmed_by TEXT,
    PRIMARY KEY (session_id, attempt, gateway_id)
);
CREATE INDEX close_tasks_open ON close_tasks (confirmed_at, next_at);
CREATE TABLE start_reports (
    gateway_id TEXT NOT NULL,
    instance TEXT NOT NULL,
    started_at TEXT NOT NULL,
    previous_instance TEXT NOT NULL,
    cut_by_crash INTEGER NOT NULL,
    key_id TEXT NOT NULL,
    batch_seq INTEGER NOT NULL,
    signed BLOB NOT NULL,
    received_at TEXT NOT NULL,
    PRIMARY KEY (gateway_id, instance)
);
ALTER TABLE connection_records ADD COLUMN instance TEXT;
ALTER TABLE connection_records ADD COLUMN conn INTEGER;
ALTER TABLE connection_records ADD COLUMN superseded INTEGER NOT NULL DEFAULT 0;
CREATE INDEX connection_records_by_conn ON connection_records (gateway_id, instance, conn);
ALTER TABLE batch_rejections ADD COLUMN sessions TEXT NOT NULL DEFAULT '[]';
CREATE TABLE chain_gaps (
    gateway_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    found TEXT NOT NULL,
    reason TEXT NOT NULL,
    expected_digest TEXT,
    window_after TEXT,
    window_before TEXT NOT NULL,
    set_aside_file TEXT,
    set_aside_at TEXT NOT NULL,
    received_at TEXT NOT NULL,
    PRIMARY KEY (gateway_id, seq)
);
CREATE TABLE certificates (
    session_id TEXT PRIMARY KEY NOT NULL REFERENCES sessions (id),
    issued_at TEXT NOT NULL,
    payload BLOB NOT NULL,
    signature BLOB NOT NULL,
    key_id TEXT NOT NULL
);
"#;

/// Version 5: an open in flight reaches the store. The states
/// `launching`, `resuming` and `recovering` (the sessions table is rebuilt:
/// SQLite cannot change a CHECK).
const SCHEMA_V5: &str = r#"
CREATE TABLE sessions_v5 (
    id TEXT PRIMARY KEY NOT NULL,
    tenant TEXT NOT NULL,
    mode TEXT NOT NULL CHECK (mode IN ('agent', 'commands')),
    state TEXT NOT NULL
        CHECK (state IN ('launching', 'running', 'paused', 'resuming', 'interrupted',
                         'recovering', 'stopping', 'ended', 'reset_incomplete')),
    created_at TEXT NOT NULL,
    ended_at TEXT,
    end_reason TEXT,
    outcome TEXT,
    allow TEXT NOT NULL,
    attach TEXT NOT NULL,
    sources TEXT NOT NULL,
    idle_timeout_seconds INTEGER,
    idle_action TEXT CHECK (idle_action IN ('end', 'pause')),
    last_activity_at TEXT
);
INSERT INTO sessions_v5 SELECT id, tenant, mode, state, created_at, ended_at, end_reason,
    outcome, allow, attach, sources, idle_timeout_seconds, idle_action, last_activity_at
    FROM sessions;
DROP TABLE sessions;
ALTER TABLE sessions_v5 RENAME TO sessions;
"#;

/// Version 6: an audit trail that keeps every step. A reset step's
/// outcomes are numbered (`n`) and never replaced: a step recorded again
/// with another outcome adds a row beside the first. Every command and
/// time-driven event that moved a session is recorded with who asked. The
/// members of the pair are stored with their control addresses.
const SCHEMA_V6: &str = r#"
CREATE TABLE reset_steps_v6 (
    session_id TEXT NOT NULL REFERENCES sessions (id),
    step INTEGER NOT NULL CHECK (step BETWEEN 1 AND 5),
    n INTEGER NOT NULL CHECK (n >= 1),
    name TEXT NOT NULL,
    confirmed INTEGER NOT NULL CHECK (confirmed IN (0, 1)),
    response TEXT NOT NULL,
    error TEXT,
    at TEXT NOT NULL,
    PRIMARY KEY (session_id, step, n)
);
INSERT INTO reset_steps_v6 SELECT session_id, step, 1, name, confirmed, response, error, at
    FROM reset_steps;
DROP TABLE reset_steps;
ALTER TABLE reset_steps_v6 RENAME TO reset_steps;
CREATE TABLE commands (
    session_id TEXT NOT NULL REFERENCES sessions (id),
    n INTEGER NOT NULL CHECK (n >= 1),
    event TEXT NOT NULL,
    requester TEXT NOT NULL CHECK (requester IN ('operator', 'approver', 'time')),
    requested_by TEXT NOT NULL,
    attempt INTEGER,
    at TEXT NOT NULL,
    PRIMARY KEY (session_id, n)
);
CREATE TABLE members (
    id TEXT PRIMARY KEY NOT NULL,
    control TEXT NOT NULL,
    added_at TEXT NOT NULL
);
CREATE INDEX ca_events_live ON ca_events (session_id, attempt) WHERE destroyed_at IS NULL;
"#;

/// The whole schema of version 6 in one script, the tables in the order
/// their references need: how a PostgreSQL store begins (it has no older
/// versions to upgrade). The same tables and columns as a SQLite store
/// brought up through versions 1 to 6 (a test compares them), written in
/// SQLite's words and given to PostgreSQL through [`for_postgres`]; the
/// tables read in insertion order name it `rowid`, as SQLite's own.
const WHOLE_V6: &str = r#"
CREATE TABLE egress (
    name TEXT PRIMARY KEY NOT NULL,
    added_at TEXT NOT NULL
);
CREATE TABLE secrets (
    tenant TEXT NOT NULL,
    name TEXT NOT NULL,
    value BLOB NOT NULL,
    updated_at TEXT NOT NULL,
    PRIMARY KEY (tenant, name)
);
CREATE TABLE gateways (
    id TEXT PRIMARY KEY NOT NULL,
    public_key_hex TEXT NOT NULL,
    registered_at TEXT NOT NULL,
    instance TEXT,
    lease_ms INTEGER,
    last_contact_at TEXT,
    last_error TEXT
);
CREATE TABLE sessions (
    id TEXT PRIMARY KEY NOT NULL,
    tenant TEXT NOT NULL,
    mode TEXT NOT NULL CHECK (mode IN ('agent', 'commands')),
    state TEXT NOT NULL
        CHECK (state IN ('launching', 'running', 'paused', 'resuming', 'interrupted',
                         'recovering', 'stopping', 'ended', 'reset_incomplete')),
    created_at TEXT NOT NULL,
    ended_at TEXT,
    end_reason TEXT,
    outcome TEXT,
    allow TEXT NOT NULL,
    attach TEXT NOT NULL,
    sources TEXT NOT NULL,
    idle_timeout_seconds INTEGER,
    idle_action TEXT CHECK (idle_action IN ('end', 'pause')),
    last_activity_at TEXT
);
CREATE TABLE attempts (
    session_id TEXT NOT NULL REFERENCES sessions (id),
    n INTEGER NOT NULL CHECK (n >= 1),
    cause TEXT NOT NULL CHECK (cause IN ('launch', 'resume', 'recovery')),
    started_at TEXT NOT NULL,
    ended_at TEXT,
    end_cause TEXT,
    allowlist TEXT NOT NULL,
    attachments TEXT NOT NULL,
    lock TEXT NOT NULL DEFAULT '[]',
    relay_public_key TEXT,
    PRIMARY KEY (session_id, n)
);
CREATE TABLE ca_events (
    session_id TEXT NOT NULL,
    attempt INTEGER NOT NULL,
    gateway_id TEXT NOT NULL,
    digest TEXT NOT NULL,
    cert_pem TEXT NOT NULL,
    made_at TEXT NOT NULL,
    destroyed_at TEXT,
    destroy_reason TEXT,
    instance TEXT,
    destroy_report TEXT,
    PRIMARY KEY (session_id, attempt, gateway_id),
    FOREIGN KEY (session_id, attempt) REFERENCES attempts (session_id, n)
);
CREATE INDEX ca_events_live ON ca_events (session_id, attempt) WHERE destroyed_at IS NULL;
CREATE TABLE drop_reports (
    rowid ROWID,
    session_id TEXT NOT NULL,
    attempt INTEGER NOT NULL,
    gateway_id TEXT NOT NULL,
    reason TEXT NOT NULL,
    ca_digest TEXT NOT NULL,
    secrets TEXT NOT NULL,
    signed BLOB NOT NULL,
    received_at TEXT NOT NULL,
    verifier TEXT NOT NULL,
    ca_error TEXT,
    secrets_error TEXT,
    instance TEXT,
    via TEXT NOT NULL DEFAULT 'reply',
    batch_seq INTEGER,
    FOREIGN KEY (session_id, attempt) REFERENCES attempts (session_id, n)
);
CREATE INDEX drop_reports_by_attempt ON drop_reports (session_id, attempt);
CREATE TABLE reset_steps (
    session_id TEXT NOT NULL REFERENCES sessions (id),
    step INTEGER NOT NULL CHECK (step BETWEEN 1 AND 5),
    n INTEGER NOT NULL CHECK (n >= 1),
    name TEXT NOT NULL,
    confirmed INTEGER NOT NULL CHECK (confirmed IN (0, 1)),
    response TEXT NOT NULL,
    error TEXT,
    at TEXT NOT NULL,
    PRIMARY KEY (session_id, step, n)
);
CREATE TABLE batches (
    gateway_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    digest TEXT NOT NULL,
    received_at TEXT NOT NULL,
    PRIMARY KEY (gateway_id, seq)
);
CREATE TABLE connection_records (
    rowid ROWID,
    gateway_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    idx INTEGER NOT NULL,
    session_id TEXT,
    json TEXT NOT NULL,
    instance TEXT,
    conn INTEGER,
    superseded INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (gateway_id, seq, idx),
    FOREIGN KEY (gateway_id, seq) REFERENCES batches (gateway_id, seq)
);
CREATE INDEX connection_records_by_session ON connection_records (session_id);
CREATE INDEX connection_records_by_conn ON connection_records (gateway_id, instance, conn);
CREATE TABLE batch_rejections (
    rowid ROWID,
    gateway_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    reason TEXT NOT NULL,
    at TEXT NOT NULL,
    sessions TEXT NOT NULL DEFAULT '[]'
);
CREATE TABLE chain_state (
    gateway_id TEXT PRIMARY KEY NOT NULL,
    json TEXT NOT NULL
);
CREATE TABLE lock_rules (
    n INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT UNIQUE NOT NULL,
    destination TEXT NOT NULL,
    attachment TEXT NOT NULL,
    method TEXT NOT NULL,
    path_prefix TEXT NOT NULL,
    mode TEXT NOT NULL CHECK (mode IN ('first_use', 'every_request')),
    approvers TEXT NOT NULL,
    created_at TEXT NOT NULL
);
CREATE TABLE proposals (
    rowid ROWID,
    proposal_id TEXT PRIMARY KEY NOT NULL,
    gateway_id TEXT NOT NULL,
    session_id TEXT NOT NULL REFERENCES sessions (id),
    attempt INTEGER NOT NULL,
    rule TEXT NOT NULL,
    fields TEXT NOT NULL,
    sentence TEXT NOT NULL,
    digest TEXT NOT NULL,
    state TEXT NOT NULL
        CHECK (state IN ('pending', 'approved', 'declined', 'withdrawn', 'expired')),
    approver TEXT,
    decided_at TEXT,
    created_at TEXT NOT NULL,
    expires_at TEXT NOT NULL,
    received_at TEXT NOT NULL,
    decision TEXT,
    outcome TEXT
);
CREATE INDEX proposals_by_session ON proposals (session_id);
CREATE INDEX proposals_by_state ON proposals (state);
CREATE TABLE approvers (
    name TEXT PRIMARY KEY NOT NULL,
    token_sha256 TEXT UNIQUE NOT NULL,
    created_at TEXT NOT NULL
);
CREATE TABLE close_tasks (
    session_id TEXT NOT NULL REFERENCES sessions (id),
    attempt INTEGER NOT NULL,
    gateway_id TEXT NOT NULL,
    reason TEXT NOT NULL,
    created_at TEXT NOT NULL,
    tries INTEGER NOT NULL DEFAULT 0,
    next_at TEXT NOT NULL,
    last_error TEXT,
    confirmed_at TEXT,
    confirmed_by TEXT,
    PRIMARY KEY (session_id, attempt, gateway_id)
);
CREATE INDEX close_tasks_open ON close_tasks (confirmed_at, next_at);
CREATE TABLE start_reports (
    gateway_id TEXT NOT NULL,
    instance TEXT NOT NULL,
    started_at TEXT NOT NULL,
    previous_instance TEXT NOT NULL,
    cut_by_crash INTEGER NOT NULL,
    key_id TEXT NOT NULL,
    batch_seq INTEGER NOT NULL,
    signed BLOB NOT NULL,
    received_at TEXT NOT NULL,
    PRIMARY KEY (gateway_id, instance)
);
CREATE TABLE chain_gaps (
    gateway_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    found TEXT NOT NULL,
    reason TEXT NOT NULL,
    expected_digest TEXT,
    window_after TEXT,
    window_before TEXT NOT NULL,
    set_aside_file TEXT,
    set_aside_at TEXT NOT NULL,
    received_at TEXT NOT NULL,
    PRIMARY KEY (gateway_id, seq)
);
CREATE TABLE certificates (
    session_id TEXT PRIMARY KEY NOT NULL REFERENCES sessions (id),
    issued_at TEXT NOT NULL,
    payload BLOB NOT NULL,
    signature BLOB NOT NULL,
    key_id TEXT NOT NULL
);
CREATE TABLE commands (
    session_id TEXT NOT NULL REFERENCES sessions (id),
    n INTEGER NOT NULL CHECK (n >= 1),
    event TEXT NOT NULL,
    requester TEXT NOT NULL CHECK (requester IN ('operator', 'approver', 'time')),
    requested_by TEXT NOT NULL,
    attempt INTEGER,
    at TEXT NOT NULL,
    PRIMARY KEY (session_id, n)
);
CREATE TABLE members (
    id TEXT PRIMARY KEY NOT NULL,
    control TEXT NOT NULL,
    added_at TEXT NOT NULL
);
"#;

/// An upgrade after version 6: its tables and indexes written once for
/// both databases (through [`for_postgres`] for PostgreSQL), then what
/// each database changes in its own words (a table SQLite must rebuild to
/// change a CHECK, which PostgreSQL alters in place), then what it fills
/// them with from the rows already there, in each database's words where
/// they differ.
struct Upgrade {
    /// The version it makes.
    to: i64,
    ddl: &'static str,
    sqlite_ddl: &'static str,
    postgres_ddl: &'static str,
    sqlite_data: &'static str,
    postgres_data: &'static str,
}

/// The upgrades after version 6, in order.
const UPGRADES: &[Upgrade] = &[
    // Version 7: the sessions by source address, so a start checks that
    // its sources are no live session's with one indexed look-up, not a
    // read of every live session (a start took time in proportion to the
    // sessions running: 0.1 s each at 10,000).
    Upgrade {
        to: 7,
        ddl: "
CREATE TABLE session_sources (
    session_id TEXT NOT NULL REFERENCES sessions (id),
    source TEXT NOT NULL,
    PRIMARY KEY (session_id, source)
);
CREATE INDEX session_sources_by_source ON session_sources (source);
",
        sqlite_ddl: "",
        postgres_ddl: "",
        sqlite_data: "
INSERT INTO session_sources (session_id, source)
    SELECT s.id, j.value FROM sessions s, json_each(s.sources) j;
",
        postgres_data: "
INSERT INTO session_sources (session_id, source)
    SELECT s.id, jsonb_array_elements_text(s.sources::jsonb) FROM sessions s;
",
    },
    // Version 8: the destinations the account marks passthrough (passed on
    // by the gateway without termination), and which of its names each
    // attempt opened as passthrough; the model route's three names to
    // begin with — except a name a Lock rule already names, which stays
    // terminated so that the rule keeps holding what it held (a
    // passthrough destination can carry no rule).
    Upgrade {
        to: 8,
        ddl: "
CREATE TABLE passthrough (
    name TEXT PRIMARY KEY NOT NULL,
    added_at TEXT NOT NULL
);
ALTER TABLE attempts ADD COLUMN passthrough TEXT NOT NULL DEFAULT '[]';
",
        sqlite_ddl: "",
        postgres_ddl: "",
        sqlite_data: "
INSERT INTO passthrough (name, added_at)
    SELECT m.name, strftime('%Y-%m-%dT%H:%M:%fZ', 'now')
    FROM (SELECT 'claude.ai' AS name UNION ALL SELECT 'console.anthropic.com'
          UNION ALL SELECT 'api.anthropic.com') m
    WHERE NOT EXISTS (SELECT 1 FROM lock_rules r WHERE r.destination = m.name);
",
        postgres_data: "
INSERT INTO passthrough (name, added_at)
    SELECT m.name, to_char(now() AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.MS\"Z\"')
    FROM (SELECT 'claude.ai' AS name UNION ALL SELECT 'console.anthropic.com'
          UNION ALL SELECT 'api.anthropic.com') m
    WHERE NOT EXISTS (SELECT 1 FROM lock_rules r WHERE r.destination = m.name);
",
    },
    // Version 9: people's push subscriptions (Web Push, `store/push.rs`):
    // each device's endpoint and keys, per person, and how the last
    // delivery went; by endpoint too, as a push service's answer names
    // the endpoint, not the person.
    Upgrade {
        to: 9,
        ddl: "
CREATE TABLE push_subscriptions (
    person TEXT NOT NULL,
    endpoint TEXT NOT NULL,
    p256dh BLOB NOT NULL,
    auth BLOB NOT NULL,
    created_at TEXT NOT NULL,
    last_success_at TEXT,
    last_failure_at TEXT,
    last_failure TEXT,
    PRIMARY KEY (person, endpoint)
);
CREATE INDEX push_subscriptions_by_endpoint ON push_subscriptions (endpoint);
",
        sqlite_ddl: "",
        postgres_ddl: "",
        sqlite_data: "",
        postgres_data: "",
    },
    // Version 10: the hard stop and the state `failed`. Each session's
    // `stop_after_seconds` (none: no hard stop); when each attempt began
    // to run (its open's answers made it run; none: it never ran), which
    // its compute counts from; and the state `failed`, a session that
    // ended before any attempt of it ran. An attempt recorded before has
    // run when it ended otherwise than `start_failed`, or runs now; the
    // sessions that ended before keep their state.
    Upgrade {
        to: 10,
        ddl: "
ALTER TABLE attempts ADD COLUMN running_at TEXT;
",
        sqlite_ddl: "
CREATE TABLE sessions_v10 (
    id TEXT PRIMARY KEY NOT NULL,
    tenant TEXT NOT NULL,
    mode TEXT NOT NULL CHECK (mode IN ('agent', 'commands')),
    state TEXT NOT NULL
        CHECK (state IN ('launching', 'running', 'paused', 'resuming', 'interrupted',
                         'recovering', 'stopping', 'ended', 'failed', 'reset_incomplete')),
    created_at TEXT NOT NULL,
    ended_at TEXT,
    end_reason TEXT,
    outcome TEXT,
    allow TEXT NOT NULL,
    attach TEXT NOT NULL,
    sources TEXT NOT NULL,
    idle_timeout_seconds INTEGER,
    idle_action TEXT CHECK (idle_action IN ('end', 'pause')),
    last_activity_at TEXT,
    stop_after_seconds INTEGER CHECK (stop_after_seconds BETWEEN 3600 AND 604800)
);
INSERT INTO sessions_v10 SELECT id, tenant, mode, state, created_at, ended_at, end_reason,
    outcome, allow, attach, sources, idle_timeout_seconds, idle_action, last_activity_at, NULL
    FROM sessions;
DROP TABLE sessions;
ALTER TABLE sessions_v10 RENAME TO sessions;
",
        postgres_ddl: "
ALTER TABLE sessions DROP CONSTRAINT sessions_state_check;
ALTER TABLE sessions ADD CONSTRAINT sessions_state_check
    CHECK (state IN ('launching', 'running', 'paused', 'resuming', 'interrupted',
                     'recovering', 'stopping', 'ended', 'failed', 'reset_incomplete'));
ALTER TABLE sessions ADD COLUMN stop_after_seconds BIGINT
    CHECK (stop_after_seconds BETWEEN 3600 AND 604800);
",
        sqlite_data: RUNNING_BEFORE_V10,
        postgres_data: RUNNING_BEFORE_V10,
    },
    // Version 11: the evidence a certificate bundle carries exactly as it
    // was signed (`control-stub certificate bundle`): each accepted batch's
    // signed envelope (the payload's bytes, the signature, the key id), and
    // each gateway signing key's binding under the control CA as the
    // member gave it. Batches accepted before have none (their sessions'
    // bundles say so).
    Upgrade {
        to: 11,
        ddl: "
CREATE TABLE signed_batches (
    gateway_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    key_id TEXT NOT NULL,
    payload BLOB NOT NULL,
    signature BLOB NOT NULL,
    PRIMARY KEY (gateway_id, seq)
);
CREATE TABLE key_bindings (
    gateway_id TEXT NOT NULL,
    public_key_hex TEXT NOT NULL,
    binding BLOB NOT NULL,
    received_at TEXT NOT NULL,
    PRIMARY KEY (gateway_id, public_key_hex)
);
",
        sqlite_ddl: "",
        postgres_ddl: "",
        sqlite_data: "",
        postgres_data: "",
    },
    // Version 12: people and their passkeys (`store/people.rs`, issue
    // 42): the people who decide cards and start commands from the web
    // app, each with a role; their passkeys (public keys only); one-time
    // enrolment links (a token's SHA-256); web sessions (a cookie's
    // SHA-256); the challenges issued for passkey ceremonies; the sign-in
    // failure counters. A decision and a command keep the passkey
    // assertion that authorised them. The approvals API's bearer tokens
    // are retired: each approver with a token, and each name a Lock rule
    // names, becomes a person with the role approver and no passkey (so
    // they enrol before they can decide), and the tokens are dropped.
    Upgrade {
        to: 12,
        ddl: "
CREATE TABLE people (
    name TEXT PRIMARY KEY NOT NULL,
    role TEXT NOT NULL CHECK (role IN ('approver', 'operator')),
    user_handle BLOB UNIQUE,
    created_at TEXT NOT NULL
);
CREATE TABLE passkeys (
    credential_id BLOB PRIMARY KEY NOT NULL,
    person TEXT NOT NULL REFERENCES people (name),
    public_key_cose BLOB NOT NULL,
    alg TEXT NOT NULL,
    sign_count INTEGER NOT NULL,
    aaguid TEXT NOT NULL,
    backup_eligible INTEGER NOT NULL CHECK (backup_eligible IN (0, 1)),
    backed_up INTEGER NOT NULL CHECK (backed_up IN (0, 1)),
    attestation TEXT NOT NULL,
    created_at TEXT NOT NULL,
    last_used_at TEXT
);
CREATE INDEX passkeys_by_person ON passkeys (person);
CREATE TABLE enrolments (
    token_sha256 TEXT PRIMARY KEY NOT NULL,
    person TEXT NOT NULL REFERENCES people (name),
    role TEXT NOT NULL CHECK (role IN ('approver', 'operator')),
    created_at TEXT NOT NULL,
    expires_at TEXT NOT NULL,
    used_at TEXT
);
CREATE INDEX enrolments_by_person ON enrolments (person);
CREATE TABLE web_sessions (
    id TEXT PRIMARY KEY NOT NULL,
    token_sha256 TEXT UNIQUE NOT NULL,
    person TEXT NOT NULL REFERENCES people (name),
    csrf TEXT NOT NULL,
    credential_id BLOB NOT NULL,
    source TEXT NOT NULL,
    created_at TEXT NOT NULL,
    rotated_at TEXT NOT NULL,
    last_seen_at TEXT NOT NULL,
    idle_expires_at TEXT NOT NULL,
    expires_at TEXT NOT NULL
);
CREATE INDEX web_sessions_by_person ON web_sessions (person);
CREATE TABLE challenges (
    id TEXT PRIMARY KEY NOT NULL,
    purpose TEXT NOT NULL CHECK (purpose IN ('sign_in', 'enrol', 'command')),
    challenge BLOB NOT NULL,
    person TEXT,
    enrolment TEXT,
    command TEXT,
    session_id TEXT,
    source TEXT NOT NULL,
    created_at TEXT NOT NULL,
    expires_at TEXT NOT NULL
);
CREATE INDEX challenges_by_expiry ON challenges (expires_at);
CREATE TABLE sign_in_failures (
    scope TEXT PRIMARY KEY NOT NULL,
    window_started_at TEXT NOT NULL,
    failures INTEGER NOT NULL
);
ALTER TABLE proposals ADD COLUMN assertion TEXT;
ALTER TABLE commands ADD COLUMN verified INTEGER NOT NULL DEFAULT 0;
ALTER TABLE commands ADD COLUMN assertion TEXT;
",
        sqlite_ddl: "",
        postgres_ddl: "",
        sqlite_data: "
INSERT INTO people (name, role, created_at) SELECT name, 'approver', created_at FROM approvers;
INSERT INTO people (name, role, created_at)
    SELECT DISTINCT j.value, 'approver', strftime('%Y-%m-%dT%H:%M:%fZ', 'now')
    FROM lock_rules r, json_each(r.approvers) j
    WHERE j.value NOT IN (SELECT name FROM people);
DROP TABLE approvers;
",
        postgres_data: "
INSERT INTO people (name, role, created_at) SELECT name, 'approver', created_at FROM approvers;
INSERT INTO people (name, role, created_at)
    SELECT DISTINCT a.name, 'approver',
           to_char(now() AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.MS\"Z\"')
    FROM lock_rules r, jsonb_array_elements_text(r.approvers::jsonb) AS a(name)
    WHERE a.name NOT IN (SELECT name FROM people);
DROP TABLE approvers;
",
    },
    // Version 13: the account's settings (`store/settings.rs`, issue 42):
    // the lab approvals switch (a decision with no person's passkey
    // assertion counts only while it is on) and the people's web app's
    // rp id and origin, which every open carries to the gateways; each
    // with who set it and when. Each attempt records whether it opened in
    // lab mode (its certificate says so).
    Upgrade {
        to: 13,
        ddl: "
CREATE TABLE account_settings (
    name TEXT PRIMARY KEY NOT NULL,
    value TEXT NOT NULL,
    changed_at TEXT NOT NULL,
    changed_by TEXT NOT NULL
);
ALTER TABLE attempts ADD COLUMN lab_approvals INTEGER NOT NULL DEFAULT 0;
",
        sqlite_ddl: "",
        postgres_ddl: "",
        sqlite_data: "",
        postgres_data: "",
    },
    // Version 14: one card per first use across the pair (issue 42): a
    // `first_use` rule's proposal that another of the same session
    // attempt and rule already carries is kept joined to that card
    // (`answered_by`, its proposal id) and answered with its decision,
    // not shown as a card of its own.
    Upgrade {
        to: 14,
        ddl: "
ALTER TABLE proposals ADD COLUMN answered_by TEXT;
",
        sqlite_ddl: "",
        postgres_ddl: "",
        sqlite_data: "",
        postgres_data: "",
    },
];

/// Version 10's attempts recorded before it: each one that ended otherwise
/// than `start_failed`, or that runs now, ran from its start (when its open
/// was committed; its answers' time was not kept).
const RUNNING_BEFORE_V10: &str = "
UPDATE attempts SET running_at = started_at
    WHERE end_cause IN ('paused', 'interrupted', 'session_ended')
       OR (ended_at IS NULL
           AND EXISTS (SELECT 1 FROM sessions s
                       WHERE s.id = attempts.session_id AND s.state = 'running'));
";

/// Run on SQLite every upgrade after `from`.
fn upgrade_sqlite(tx: &rusqlite::Transaction<'_>, from: i64) -> Result<(), Error> {
    for u in UPGRADES.iter().filter(|u| u.to > from) {
        tx.execute_batch(u.ddl)?;
        tx.execute_batch(u.sqlite_ddl)?;
        tx.execute_batch(u.sqlite_data)?;
    }
    Ok(())
}

/// Run on PostgreSQL every upgrade after `from`.
fn upgrade_postgres(tx: &mut postgres::Transaction<'_>, from: i64) -> Result<(), Error> {
    for u in UPGRADES.iter().filter(|u| u.to > from) {
        tx.batch_execute(&for_postgres(u.ddl))?;
        tx.batch_execute(u.postgres_ddl)?;
        tx.batch_execute(u.postgres_data)?;
    }
    Ok(())
}

/// A script in SQLite's words as PostgreSQL takes it: 64-bit integers,
/// bytes, text compared byte by byte (SQLite's order, whatever the
/// database's locale), a generated key for `AUTOINCREMENT`, and `ROWID`
/// as a generated column (SQLite's own rowid, made explicit).
pub(super) fn for_postgres(sql: &str) -> String {
    let mut out = Vec::new();
    for line in sql.lines() {
        let line = line
            .replace(
                "INTEGER PRIMARY KEY AUTOINCREMENT",
                "BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY",
            )
            .replace("rowid ROWID", "rowid BIGINT GENERATED ALWAYS AS IDENTITY")
            .replace("INTEGER", "BIGINT")
            .replace("BLOB", "BYTEA")
            .replace(" TEXT", " TEXT COLLATE \"C\"");
        out.push(line);
    }
    out.join("\n")
}

/// The schema's version in a PostgreSQL store: one row of
/// `schema_version`, made with the tables.
const PG_VERSION_TABLE: &str =
    "CREATE TABLE IF NOT EXISTS schema_version (version BIGINT NOT NULL)";

/// Bring the schema of the PostgreSQL store `db` up to [`SCHEMA_VERSION`],
/// in one transaction under the write lock (so replicas starting at once
/// make it once); refuse a database from a newer version.
pub(super) fn migrate_postgres(
    client: &mut postgres::Client,
    db: &dyn std::fmt::Display,
) -> Result<(), Error> {
    let mut tx = client.transaction()?;
    write_lock::take(&mut tx)?;
    tx.batch_execute(PG_VERSION_TABLE)?;
    let version: Option<i64> = tx
        .query_opt("SELECT version FROM schema_version", &[])?
        .map(|r| r.get(0));
    match version {
        None => {
            tx.batch_execute(&for_postgres(WHOLE_V6))?;
            upgrade_postgres(&mut tx, 6)?;
            tx.execute(
                "INSERT INTO schema_version (version) VALUES ($1)",
                &[&SCHEMA_VERSION],
            )?;
        }
        Some(v) if v == SCHEMA_VERSION => {}
        Some(v) if (6..SCHEMA_VERSION).contains(&v) => {
            upgrade_postgres(&mut tx, v)?;
            tx.execute("UPDATE schema_version SET version = $1", &[&SCHEMA_VERSION])?;
        }
        Some(v) => {
            return Err(Error::Store(format!(
                "{db}: schema version {v} is not one this control stub knows \
                 (it knows {SCHEMA_VERSION})"
            )))
        }
    }
    tx.commit()?;
    Ok(())
}

/// The whole schema as PostgreSQL is given it, for the test that compares
/// it with SQLite's.
#[doc(hidden)]
pub fn postgres_ddl() -> String {
    for_postgres(WHOLE_V6)
}

/// The tables of every version up to `version` (1 to [`SCHEMA_VERSION`]),
/// as one script: what a store of that version was made with. For tests of
/// the upgrade.
#[doc(hidden)]
pub fn ddl_through(version: i64) -> String {
    let all = [
        SCHEMA_V1, SCHEMA_V2, SCHEMA_V3, SCHEMA_V4, SCHEMA_V5, SCHEMA_V6,
    ];
    let mut out = all[..usize::try_from(version).unwrap_or(0).min(all.len())].concat();
    for u in UPGRADES.iter().filter(|u| u.to <= version) {
        out.push_str(u.ddl);
        out.push_str(u.sqlite_ddl);
    }
    out
}

/// Bring the schema of the store at `path` up to [`SCHEMA_VERSION`], in one
/// transaction; refuse a file from a newer version.
///
/// Foreign keys are off while it runs (the version 4, 5 and 9 upgrades
/// rebuild the sessions table other tables refer to, version 6 the reset
/// steps) and on again after.
pub(super) fn migrate(conn: &mut Connection, path: &Path) -> Result<(), Error> {
    conn.pragma_update(None, "foreign_keys", "OFF")?;
    let result = migrate_tx(conn, path);
    conn.pragma_update(None, "foreign_keys", "ON")?;
    result
}

fn migrate_tx(conn: &mut Connection, path: &Path) -> Result<(), Error> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let version: i64 = tx.pragma_query_value(None, "user_version", |r| r.get(0))?;
    match version {
        0..SCHEMA_VERSION => {
            let legacy = [
                SCHEMA_V1, SCHEMA_V2, SCHEMA_V3, SCHEMA_V4, SCHEMA_V5, SCHEMA_V6,
            ];
            let from = usize::try_from(version).unwrap_or(0).min(legacy.len());
            for sql in &legacy[from..] {
                tx.execute_batch(sql)?;
            }
            upgrade_sqlite(&tx, version.max(6))?;
            let broken: i64 =
                tx.query_row("SELECT count(*) FROM pragma_foreign_key_check", [], |r| {
                    r.get(0)
                })?;
            if broken > 0 {
                return Err(Error::Store(format!(
                    "{}: {broken} rows refer to rows that do not exist; not upgraded",
                    path.display()
                )));
            }
            tx.pragma_update(None, "user_version", SCHEMA_VERSION)?;
        }
        SCHEMA_VERSION => {}
        v => {
            return Err(Error::Store(format!(
                "{}: schema version {v} is not one this control stub knows \
                 (it knows {SCHEMA_VERSION})",
                path.display()
            )))
        }
    }
    tx.commit()?;
    Ok(())
}
