//! People and their passkeys (issue 42): the approvers and operators who
//! use the web app, the passkeys they enrolled, their one-time enrolment
//! links, their web sessions, the challenges issued for their passkey
//! ceremonies, and the sign-in failure counters. What uses these tables is
//! [`crate::people`].
//!
//! Nothing here is secret, and nothing that would let its reader act as a
//! person is kept: a passkey is its public key; an enrolment link and a
//! session cookie are kept only as the SHA-256 of their token (the token
//! is shown once, to its holder); a challenge is public by nature (it is
//! signed, not kept secret). The one value a session keeps in clear is its
//! CSRF token, which alone lets nobody act (every request also needs the
//! cookie). Debug output shows none of the hashes.
//!
//! Times are RFC 3339 UTC with milliseconds (`now()`'s form): text of one
//! width, so comparing two as text compares the times.

use serde::{Deserialize, Serialize};

use super::db::{Store, Tx};
use super::value::{params, OptionalExtension, Row};
use crate::error::Error;
use crate::model::Role;

/// A person: a name the Lock's rules and the cards use, and a role.
#[derive(Clone, PartialEq, Eq, Serialize)]
pub struct Person {
    pub name: String,
    pub role: Role,
    pub created_at: String,
    /// The WebAuthn user handle (`user.id`): 32 random bytes, made when
    /// the person is first enrolled; the same for every passkey they hold.
    #[serde(skip)]
    pub user_handle: Option<Vec<u8>>,
}

impl std::fmt::Debug for Person {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Person")
            .field("name", &self.name)
            .field("role", &self.role)
            .field("created_at", &self.created_at)
            .finish_non_exhaustive()
    }
}

/// A passkey: a credential's public half, as registration verified it.
#[derive(Clone, PartialEq, Eq, Serialize)]
pub struct Passkey {
    /// The credential id (base64url in JSON).
    #[serde(serialize_with = "b64")]
    pub credential_id: Vec<u8>,
    pub person: String,
    /// The COSE public key, as the authenticator gave it.
    #[serde(skip)]
    pub public_key_cose: Vec<u8>,
    /// `ES256`, `EdDSA` or `RS256`.
    pub alg: String,
    /// The highest sign count seen.
    pub sign_count: u32,
    /// The authenticator's model (hex; zeros when the browser hides it).
    pub aaguid: String,
    /// BE: the passkey may be synced to the person's other devices.
    pub backup_eligible: bool,
    /// BS: it was synced when last seen.
    pub backed_up: bool,
    /// How its registration was attested (`none`, `packed_self`).
    pub attestation: String,
    pub created_at: String,
    pub last_used_at: Option<String>,
}

impl std::fmt::Debug for Passkey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Passkey")
            .field("credential_id", &hex::encode(&self.credential_id))
            .field("person", &self.person)
            .field("alg", &self.alg)
            .field("sign_count", &self.sign_count)
            .finish_non_exhaustive()
    }
}

fn b64<S: serde::Serializer>(bytes: &[u8], s: S) -> Result<S::Ok, S::Error> {
    use base64::Engine as _;
    s.serialize_str(&base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes))
}

/// A one-time enrolment link, by the SHA-256 of its token.
#[derive(Clone, PartialEq, Eq)]
pub struct Enrolment {
    pub token_sha256: String,
    pub person: String,
    pub role: Role,
    pub created_at: String,
    pub expires_at: String,
    /// When it was used; a link is good once.
    pub used_at: Option<String>,
}

impl std::fmt::Debug for Enrolment {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Enrolment")
            .field("person", &self.person)
            .field("role", &self.role)
            .field("expires_at", &self.expires_at)
            .field("used_at", &self.used_at)
            .finish_non_exhaustive()
    }
}

/// A signed-in person's web session, by the SHA-256 of its cookie's token.
#[derive(Clone, PartialEq, Eq)]
pub struct WebSession {
    /// The session's own id: random, internal, never sent to the browser
    /// (the cookie carries a token that changes at each rotation; this
    /// stays).
    pub id: String,
    pub person: String,
    /// The person's role, read with the session.
    pub role: Role,
    /// The CSRF token state-changing requests carry in a header.
    pub csrf: String,
    /// The passkey the person signed in with.
    pub credential_id: Vec<u8>,
    /// The address the sign-in came from.
    pub source: String,
    pub created_at: String,
    /// When the cookie's token was last replaced.
    pub rotated_at: String,
    pub last_seen_at: String,
    /// Past this, with no request since, the session is over.
    pub idle_expires_at: String,
    /// Past this the session is over, whatever the person does.
    pub expires_at: String,
}

impl std::fmt::Debug for WebSession {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WebSession")
            .field("person", &self.person)
            .field("role", &self.role)
            .field("created_at", &self.created_at)
            .field("expires_at", &self.expires_at)
            .finish_non_exhaustive()
    }
}

crate::model::words! {
    /// What a challenge was issued for.
    pub enum ChallengePurpose {
        SignIn => "sign_in",
        Enrol => "enrol",
        /// A command a person starts (Revoke All): the challenge row holds
        /// the nonce; the signed challenge is computed from it.
        Command => "command",
    }
}

/// A challenge the server issued: single use, short-lived.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct Challenge {
    /// Its handle, which the page sends back with the response.
    pub id: String,
    pub purpose: ChallengePurpose,
    /// The raw challenge (sign-in, enrolment), or the command's nonce.
    pub challenge: Vec<u8>,
    /// Whom it was issued to (enrolment, command).
    pub person: Option<String>,
    /// The enrolment's token hash (enrolment).
    pub enrolment: Option<String>,
    /// The command (`revoke_all`) and its session (command).
    pub command: Option<String>,
    pub session_id: Option<String>,
    /// The address that asked.
    pub source: String,
    pub created_at: String,
    pub expires_at: String,
}

/// What `people list` shows of a person.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct PersonInfo {
    #[serde(flatten)]
    pub person: Person,
    pub passkeys: Vec<Passkey>,
    /// Enrolment links not used and not expired, by their expiry.
    pub enrolments_open: Vec<String>,
    /// Web sessions not expired.
    pub web_sessions: usize,
}

/// What went with a person.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct PersonRemoved {
    pub passkeys: usize,
    pub web_sessions: usize,
    pub enrolments: usize,
    pub push_subscriptions: usize,
}

/// A passkey assertion the web app verified, kept with the decision or
/// command it authorised, whole: an auditor (and the gateway, which checks
/// a decision's itself) verifies it again from these fields and the
/// passkey's public key. Binary fields are base64url without padding, as
/// WebAuthn's JSON forms carry them. None of it is secret: it is a
/// signature over a challenge that named one card and verdict, or one
/// command on one session.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SignedByPasskey {
    /// Whose passkey signed.
    pub person: String,
    /// The credential id (`rawId`).
    pub credential_id: String,
    /// `response.authenticatorData`.
    pub authenticator_data: String,
    /// `response.clientDataJSON`.
    pub client_data_json: String,
    /// `response.signature`.
    pub signature: String,
    /// `response.userHandle`, when the authenticator gave one.
    pub user_handle: Option<String>,
    /// The sign count the assertion carried.
    pub sign_count: u32,
    /// What it was checked against: the rp id and the origin.
    pub rp_id: String,
    pub origin: String,
    /// The challenge it signs (base64url), which the server computed
    /// (a decision's or a command's: see `talos_certs::webauthn`).
    pub challenge: String,
    /// A command's nonce (hex), which its challenge covers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nonce: Option<String>,
    pub verified_at: String,
    /// The public key it was verified under, as registration stored it:
    /// the COSE_Key (base64url) and its algorithm (`ES256`, `EdDSA`,
    /// `RS256`), kept with the assertion so that it verifies from the
    /// record alone, even once the passkey is removed. Absent in records
    /// made before it was kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub public_key_cose: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub alg: Option<String>,
}

const PERSON_COLUMNS: &str = "name, role, created_at, user_handle";

fn person_row(r: &Row) -> Result<Person, Error> {
    Ok(Person {
        name: r.get(0)?,
        role: super::value::parse_word(1, r.get(1)?, Role::parse)?,
        created_at: r.get(2)?,
        user_handle: r.get(3)?,
    })
}

const PASSKEY_COLUMNS: &str = "credential_id, person, public_key_cose, alg, sign_count, aaguid,
     backup_eligible, backed_up, attestation, created_at, last_used_at";

fn passkey_row(r: &Row) -> Result<Passkey, Error> {
    Ok(Passkey {
        credential_id: r.get(0)?,
        person: r.get(1)?,
        public_key_cose: r.get(2)?,
        alg: r.get(3)?,
        sign_count: r.get(4)?,
        aaguid: r.get(5)?,
        backup_eligible: r.get(6)?,
        backed_up: r.get(7)?,
        attestation: r.get(8)?,
        created_at: r.get(9)?,
        last_used_at: r.get(10)?,
    })
}

const ENROLMENT_COLUMNS: &str = "token_sha256, person, role, created_at, expires_at, used_at";

fn enrolment_row(r: &Row) -> Result<Enrolment, Error> {
    Ok(Enrolment {
        token_sha256: r.get(0)?,
        person: r.get(1)?,
        role: super::value::parse_word(2, r.get(2)?, Role::parse)?,
        created_at: r.get(3)?,
        expires_at: r.get(4)?,
        used_at: r.get(5)?,
    })
}

const SESSION_COLUMNS: &str = "s.id, s.person, p.role, s.csrf, s.credential_id, s.source,
     s.created_at, s.rotated_at, s.last_seen_at, s.idle_expires_at, s.expires_at";

fn session_row(r: &Row) -> Result<WebSession, Error> {
    Ok(WebSession {
        id: r.get(0)?,
        person: r.get(1)?,
        role: super::value::parse_word(2, r.get(2)?, Role::parse)?,
        csrf: r.get(3)?,
        credential_id: r.get(4)?,
        source: r.get(5)?,
        created_at: r.get(6)?,
        rotated_at: r.get(7)?,
        last_seen_at: r.get(8)?,
        idle_expires_at: r.get(9)?,
        expires_at: r.get(10)?,
    })
}

const CHALLENGE_COLUMNS: &str =
    "id, purpose, challenge, person, enrolment, command, session_id, source, created_at, expires_at";

fn challenge_row(r: &Row) -> Result<Challenge, Error> {
    Ok(Challenge {
        id: r.get(0)?,
        purpose: super::value::parse_word(1, r.get(1)?, ChallengePurpose::parse)?,
        challenge: r.get(2)?,
        person: r.get(3)?,
        enrolment: r.get(4)?,
        command: r.get(5)?,
        session_id: r.get(6)?,
        source: r.get(7)?,
        created_at: r.get(8)?,
        expires_at: r.get(9)?,
    })
}

impl Store {
    /// Every person, by name, with their passkeys, open enrolment links
    /// and live web sessions (as of `now`).
    pub fn people_list(&self, now: &str) -> Result<Vec<PersonInfo>, Error> {
        self.read(|tx| {
            let mut out = Vec::new();
            for person in tx.people()? {
                let passkeys = tx.passkeys_of(&person.name)?;
                let enrolments_open = tx
                    .enrolments_of(&person.name)?
                    .into_iter()
                    .filter(|e| e.used_at.is_none() && e.expires_at.as_str() > now)
                    .map(|e| e.expires_at)
                    .collect();
                let web_sessions = tx.live_web_sessions_of(&person.name, now)?;
                out.push(PersonInfo {
                    person,
                    passkeys,
                    enrolments_open,
                    web_sessions,
                });
            }
            Ok(out)
        })
    }
}

impl Tx<'_> {
    /// Person `name`, if there is one.
    pub fn person(&self, name: &str) -> Result<Option<Person>, Error> {
        self.conn
            .query_row(
                &format!("SELECT {PERSON_COLUMNS} FROM people WHERE name = ?1"),
                params![name],
                person_row,
            )
            .optional()
    }

    /// Every person, by name.
    pub fn people(&self) -> Result<Vec<Person>, Error> {
        let mut stmt = self.conn.prepare(&format!(
            "SELECT {PERSON_COLUMNS} FROM people ORDER BY name"
        ))?;
        let rows = stmt.query_map([], person_row)?;
        rows.collect()
    }

    /// The person whose user handle is `handle`.
    pub fn person_by_handle(&self, handle: &[u8]) -> Result<Option<Person>, Error> {
        self.conn
            .query_row(
                &format!("SELECT {PERSON_COLUMNS} FROM people WHERE user_handle = ?1"),
                params![handle],
                person_row,
            )
            .optional()
    }

    /// Add person `name` with `role`.
    pub fn insert_person(
        &self,
        name: &str,
        role: Role,
        user_handle: &[u8],
        at: &str,
    ) -> Result<(), Error> {
        self.conn.execute(
            "INSERT INTO people (name, role, user_handle, created_at) VALUES (?1, ?2, ?3, ?4)",
            params![name, role.as_str(), user_handle, at],
        )?;
        Ok(())
    }

    /// Give person `name` a user handle (one made before handles were).
    pub fn set_user_handle(&self, name: &str, user_handle: &[u8]) -> Result<(), Error> {
        self.conn.execute(
            "UPDATE people SET user_handle = ?2 WHERE name = ?1 AND user_handle IS NULL",
            params![name, user_handle],
        )?;
        Ok(())
    }

    /// Remove person `name` and everything that lets them act: passkeys,
    /// web sessions, enrolment links, challenges issued to them, push
    /// subscriptions. Their past decisions and commands stay recorded.
    pub fn delete_person(&self, name: &str) -> Result<PersonRemoved, Error> {
        let removed = PersonRemoved {
            passkeys: self
                .conn
                .execute("DELETE FROM passkeys WHERE person = ?1", params![name])?,
            web_sessions: self
                .conn
                .execute("DELETE FROM web_sessions WHERE person = ?1", params![name])?,
            enrolments: self
                .conn
                .execute("DELETE FROM enrolments WHERE person = ?1", params![name])?,
            push_subscriptions: self.conn.execute(
                "DELETE FROM push_subscriptions WHERE person = ?1",
                params![name],
            )?,
        };
        self.conn
            .execute("DELETE FROM challenges WHERE person = ?1", params![name])?;
        self.conn
            .execute("DELETE FROM people WHERE name = ?1", params![name])?;
        Ok(removed)
    }

    /// Person `name`'s passkeys, oldest first.
    pub fn passkeys_of(&self, name: &str) -> Result<Vec<Passkey>, Error> {
        let mut stmt = self.conn.prepare(&format!(
            "SELECT {PASSKEY_COLUMNS} FROM passkeys WHERE person = ?1
             ORDER BY created_at, credential_id"
        ))?;
        let rows = stmt.query_map(params![name], passkey_row)?;
        rows.collect()
    }

    /// The passkey with credential id `id`.
    pub fn passkey(&self, id: &[u8]) -> Result<Option<Passkey>, Error> {
        self.conn
            .query_row(
                &format!("SELECT {PASSKEY_COLUMNS} FROM passkeys WHERE credential_id = ?1"),
                params![id],
                passkey_row,
            )
            .optional()
    }

    /// Store a verified passkey. A credential id already stored is refused
    /// (`passkey_exists`): the same authenticator enrolled twice.
    pub fn insert_passkey(&self, p: &Passkey) -> Result<(), Error> {
        if self.passkey(&p.credential_id)?.is_some() {
            return Err(Error::PasskeyExists);
        }
        self.conn.execute(
            &format!(
                "INSERT INTO passkeys ({PASSKEY_COLUMNS})
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)"
            ),
            params![
                p.credential_id,
                p.person,
                p.public_key_cose,
                p.alg,
                p.sign_count,
                p.aaguid,
                p.backup_eligible,
                p.backed_up,
                p.attestation,
                p.created_at,
                p.last_used_at,
            ],
        )?;
        Ok(())
    }

    /// A passkey was used: its highest sign count and backup state as the
    /// verified assertion gave them, and when.
    pub fn passkey_used(
        &self,
        id: &[u8],
        sign_count: u32,
        backed_up: bool,
        at: &str,
    ) -> Result<(), Error> {
        self.conn.execute(
            "UPDATE passkeys SET sign_count = ?2, backed_up = ?3, last_used_at = ?4
             WHERE credential_id = ?1",
            params![id, sign_count, backed_up, at],
        )?;
        Ok(())
    }

    /// Which of `names` are people holding at least one passkey.
    pub fn enrolled(&self, names: &[String]) -> Result<Vec<String>, Error> {
        let mut out = Vec::new();
        for name in names {
            let n: i64 = self.conn.query_row(
                "SELECT count(*) FROM passkeys WHERE person = ?1",
                params![name],
                |r| r.get(0),
            )?;
            if n > 0 {
                out.push(name.clone());
            }
        }
        Ok(out)
    }

    /// Record a new enrolment link.
    pub fn insert_enrolment(&self, e: &Enrolment) -> Result<(), Error> {
        self.conn.execute(
            &format!(
                "INSERT INTO enrolments ({ENROLMENT_COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6)"
            ),
            params![
                e.token_sha256,
                e.person,
                e.role.as_str(),
                e.created_at,
                e.expires_at,
                e.used_at
            ],
        )?;
        Ok(())
    }

    /// The enrolment whose token hashes to `token_sha256`.
    pub fn enrolment(&self, token_sha256: &str) -> Result<Option<Enrolment>, Error> {
        self.conn
            .query_row(
                &format!("SELECT {ENROLMENT_COLUMNS} FROM enrolments WHERE token_sha256 = ?1"),
                params![token_sha256],
                enrolment_row,
            )
            .optional()
    }

    /// Person `name`'s enrolment links, oldest first.
    pub fn enrolments_of(&self, name: &str) -> Result<Vec<Enrolment>, Error> {
        let mut stmt = self.conn.prepare(&format!(
            "SELECT {ENROLMENT_COLUMNS} FROM enrolments WHERE person = ?1 ORDER BY created_at"
        ))?;
        let rows = stmt.query_map(params![name], enrolment_row)?;
        rows.collect()
    }

    /// Mark an enrolment used at `at`; whether it was unused (a link is
    /// good once: of two uses racing, one wins).
    pub fn use_enrolment(&self, token_sha256: &str, at: &str) -> Result<bool, Error> {
        let n = self.conn.execute(
            "UPDATE enrolments SET used_at = ?2 WHERE token_sha256 = ?1 AND used_at IS NULL",
            params![token_sha256, at],
        )?;
        Ok(n == 1)
    }

    /// Record a challenge.
    pub fn insert_challenge(&self, c: &Challenge) -> Result<(), Error> {
        self.conn.execute(
            &format!(
                "INSERT INTO challenges ({CHALLENGE_COLUMNS})
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)"
            ),
            params![
                c.id,
                c.purpose.as_str(),
                c.challenge,
                c.person,
                c.enrolment,
                c.command,
                c.session_id,
                c.source,
                c.created_at,
                c.expires_at
            ],
        )?;
        Ok(())
    }

    /// Take challenge `id` (it is gone after: single use), whatever its
    /// state; the caller checks its purpose and expiry.
    pub fn take_challenge(&self, id: &str) -> Result<Option<Challenge>, Error> {
        let found = self
            .conn
            .query_row(
                &format!("SELECT {CHALLENGE_COLUMNS} FROM challenges WHERE id = ?1"),
                params![id],
                challenge_row,
            )
            .optional()?;
        if found.is_some() {
            self.conn
                .execute("DELETE FROM challenges WHERE id = ?1", params![id])?;
        }
        Ok(found)
    }

    /// Remove the challenges expired at `now`; how many went.
    pub fn prune_challenges(&self, now: &str) -> Result<usize, Error> {
        self.conn.execute(
            "DELETE FROM challenges WHERE expires_at <= ?1",
            params![now],
        )
    }

    /// Challenges outstanding: in all, and issued to `source`.
    pub fn challenges_outstanding(&self, source: &str) -> Result<(u64, u64), Error> {
        let all: i64 = self
            .conn
            .query_row("SELECT count(*) FROM challenges", params![], |r| r.get(0))?;
        let mine: i64 = self.conn.query_row(
            "SELECT count(*) FROM challenges WHERE source = ?1",
            params![source],
            |r| r.get(0),
        )?;
        Ok((
            u64::try_from(all).unwrap_or(0),
            u64::try_from(mine).unwrap_or(0),
        ))
    }

    /// Record a new web session, its cookie's token hashed.
    pub fn insert_web_session(&self, s: &WebSession, token_sha256: &str) -> Result<(), Error> {
        self.conn.execute(
            "INSERT INTO web_sessions (id, token_sha256, person, csrf, credential_id, source,
                                       created_at, rotated_at, last_seen_at, idle_expires_at,
                                       expires_at)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)",
            params![
                s.id,
                token_sha256,
                s.person,
                s.csrf,
                s.credential_id,
                s.source,
                s.created_at,
                s.rotated_at,
                s.last_seen_at,
                s.idle_expires_at,
                s.expires_at
            ],
        )?;
        Ok(())
    }

    /// The web session whose cookie's token hashes to `token_sha256`.
    pub fn web_session_by_token(&self, token_sha256: &str) -> Result<Option<WebSession>, Error> {
        self.conn
            .query_row(
                &format!(
                    "SELECT {SESSION_COLUMNS} FROM web_sessions s JOIN people p ON p.name = s.person
                     WHERE s.token_sha256 = ?1"
                ),
                params![token_sha256],
                session_row,
            )
            .optional()
    }

    /// Web session `id`.
    pub fn web_session(&self, id: &str) -> Result<Option<WebSession>, Error> {
        self.conn
            .query_row(
                &format!(
                    "SELECT {SESSION_COLUMNS} FROM web_sessions s JOIN people p ON p.name = s.person
                     WHERE s.id = ?1"
                ),
                params![id],
                session_row,
            )
            .optional()
    }

    /// A request came in session `id` at `at`: it stays until `idle`.
    pub fn touch_web_session(&self, id: &str, at: &str, idle: &str) -> Result<(), Error> {
        self.conn.execute(
            "UPDATE web_sessions SET last_seen_at = ?2, idle_expires_at = ?3 WHERE id = ?1",
            params![id, at, idle],
        )?;
        Ok(())
    }

    /// Give session `id` a new cookie token (its hash): the old one stops
    /// working at once.
    pub fn rotate_web_session(&self, id: &str, token_sha256: &str, at: &str) -> Result<(), Error> {
        self.conn.execute(
            "UPDATE web_sessions SET token_sha256 = ?2, rotated_at = ?3 WHERE id = ?1",
            params![id, token_sha256, at],
        )?;
        Ok(())
    }

    /// End session `id`; whether it was there.
    pub fn delete_web_session(&self, id: &str) -> Result<bool, Error> {
        Ok(self
            .conn
            .execute("DELETE FROM web_sessions WHERE id = ?1", params![id])?
            > 0)
    }

    /// Remove the sessions over at `now` (idle or absolute); how many.
    pub fn prune_web_sessions(&self, now: &str) -> Result<usize, Error> {
        self.conn.execute(
            "DELETE FROM web_sessions WHERE idle_expires_at <= ?1 OR expires_at <= ?1",
            params![now],
        )
    }

    /// Person `name`'s sessions not over at `now`.
    pub fn live_web_sessions_of(&self, name: &str, now: &str) -> Result<usize, Error> {
        let n: i64 = self.conn.query_row(
            "SELECT count(*) FROM web_sessions
             WHERE person = ?1 AND idle_expires_at > ?2 AND expires_at > ?2",
            params![name, now],
            |r| r.get(0),
        )?;
        Ok(usize::try_from(n).unwrap_or(0))
    }

    /// The sign-in failure counter `scope` (`all`, or `addr:` and an
    /// address): when its window began and the failures in it.
    pub fn sign_in_failures(&self, scope: &str) -> Result<Option<(String, u32)>, Error> {
        self.conn
            .query_row(
                "SELECT window_started_at, failures FROM sign_in_failures WHERE scope = ?1",
                params![scope],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .optional()
    }

    /// Set counter `scope`.
    pub fn set_sign_in_failures(
        &self,
        scope: &str,
        window_started_at: &str,
        failures: u32,
    ) -> Result<(), Error> {
        self.conn.execute(
            "INSERT INTO sign_in_failures (scope, window_started_at, failures) VALUES (?1, ?2, ?3)
             ON CONFLICT (scope) DO UPDATE SET
                 window_started_at = excluded.window_started_at, failures = excluded.failures",
            params![scope, window_started_at, failures],
        )?;
        Ok(())
    }

    /// Remove counters whose window began before `before` (they count
    /// nothing any more), so the table holds only addresses seen lately.
    pub fn prune_sign_in_failures(&self, before: &str) -> Result<usize, Error> {
        self.conn.execute(
            "DELETE FROM sign_in_failures WHERE window_started_at < ?1",
            params![before],
        )
    }
}
