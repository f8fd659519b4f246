//! The passkey ceremonies: enrolment (`navigator.credentials.create`) and
//! sign-in (`navigator.credentials.get` with a discoverable passkey), each
//! a challenge the server issues and the browser's answer it checks with
//! `talos_certs::webauthn`; and what bounds them.
//!
//! # Challenges
//!
//! 32 random bytes, issued for one purpose (sign-in, an enrolment link, a
//! person's command), kept in the store with a random handle the page
//! sends back, good for [`CHALLENGE_LIFE`] and **once**: the challenge is
//! taken out of the store, in a transaction of its own, before its answer
//! is checked, so a failed answer uses it up too. At most
//! [`MAX_CHALLENGES`] are outstanding at a time (expired ones are removed
//! before each is issued): past that, `challenges_full` (HTTP 429) until
//! some expire — a flood of sign-in starts cannot grow the store.
//!
//! # Enrolment
//!
//! The page posts the link's token; the server checks it (an enrolment
//! with that token's SHA-256, not expired, not used) and answers the
//! creation options: rp id and name, `user.id` the person's random handle,
//! the challenge, ES256, EdDSA and RS256 in that order, `residentKey` and
//! `userVerification` required, attestation `none`, and the person's
//! passkeys as `excludeCredentials` (one authenticator, one passkey). The
//! answer is checked with `verify_registration` (client data, rp id hash,
//! UP and UV, the key); the passkey is stored and the link marked used in
//! one transaction, so of two uses of a link, one wins.
//!
//! # Sign-in
//!
//! The page asks for a challenge and runs `navigator.credentials.get` with
//! no `allowCredentials` (the passkey is discoverable: the person picks it,
//! no name is typed) and user verification required. The answer names its
//! credential; the server finds that passkey, checks that the user handle
//! (when the authenticator gives one) is its person's, checks the
//! assertion with `verify_assertion` (challenge, origin, rp id hash, UP,
//! UV, signature, sign count), stores the new sign count and opens a web
//! session ([`super::sessions`]).
//!
//! # Bounded attempts
//!
//! Every sign-in start, and every enrolment start with a token no open
//! enrolment has, counts as a failed attempt until a sign-in from the same
//! address succeeds (which takes its own back). Counted per source address
//! and in all, over a window of [`SIGN_IN_WINDOW`]: at
//! [`SIGN_IN_PER_SOURCE`] from one address, or [`SIGN_IN_OVERALL`] in all,
//! the next is refused `sign_in_limited` (HTTP 429, with `Retry-After`: the
//! window's end). The counters are in the store, so every replica counts
//! the same attempts. A passkey cannot be guessed; the bound keeps a
//! client from making the server issue challenges, verify signatures and
//! write logs without end.

use std::time::{Duration, SystemTime};

use serde::Deserialize;
use talos_certs::webauthn::{
    self, verify_assertion, verify_registration, Assertion, Expected, StoredCredential,
};

use super::rp::{at, b64, parse_at, random, token_hash, unb64, RelyingParty};
use super::sessions::{self, Opened};
use crate::error::Error;
use crate::model::Role;
use crate::store::{Challenge, ChallengePurpose, Passkey, Person, Store, Tx};

/// How long a challenge is good for: a person has this long between the
/// page asking for it and their device's answer.
pub const CHALLENGE_LIFE: Duration = Duration::from_secs(2 * 60);

/// How long the page lets the browser wait for the person (WebAuthn's
/// `timeout`), inside [`CHALLENGE_LIFE`].
pub const CEREMONY_TIMEOUT: Duration = Duration::from_secs(90);

/// Challenges outstanding at most: far more than a team signs in with at
/// once, and a few hundred kilobytes of store.
pub const MAX_CHALLENGES: u64 = 1000;

/// The window sign-in attempts are counted over.
pub const SIGN_IN_WINDOW: Duration = Duration::from_secs(15 * 60);

/// Failed sign-in attempts from one address in a window: a person who
/// fumbles their phone a few times is not locked out, a script is.
pub const SIGN_IN_PER_SOURCE: u32 = 10;

/// Failed sign-in attempts in all in a window: a spread-out flood is
/// bounded too (everyone then waits for the window's end; a signed-in
/// person is not affected).
pub const SIGN_IN_OVERALL: u32 = 100;

/// The relying party's display name in the creation options.
pub const RP_NAME: &str = "TALOS";

/// The algorithms a passkey may use, in the order asked (COSE ids):
/// ES256, EdDSA, RS256.
pub const ALGORITHMS: [i64; 3] = [-7, -8, -257];

/// The bound on each base64url field a page posts, in decoded bytes:
/// webauthn's own bounds (`MAX_ATTESTATION_OBJECT_LEN` is the largest).
const MAX_FIELD: usize = webauthn::MAX_ATTESTATION_OBJECT_LEN;

fn refused_assertion(e: webauthn::AssertionError) -> Error {
    Error::PasskeyRefused {
        reason: e.as_str(),
        detail: e.to_string(),
    }
}

fn refused_registration(e: webauthn::RegistrationError) -> Error {
    Error::PasskeyRefused {
        reason: e.as_str(),
        detail: e.to_string(),
    }
}

fn invalid_challenge(why: &str) -> Error {
    Error::ChallengeInvalid { reason: why.into() }
}

/// What `navigator.credentials.get` gave, as the page posts it
/// (`PublicKeyCredential`, each buffer base64url).
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AssertionJson {
    /// `rawId`.
    pub id: String,
    pub response: AssertionResponseJson,
}

/// `AuthenticatorAssertionResponse`, each buffer base64url.
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct AssertionResponseJson {
    pub authenticator_data: String,
    #[serde(rename = "clientDataJSON")]
    pub client_data_json: String,
    pub signature: String,
    #[serde(default)]
    pub user_handle: Option<String>,
}

impl std::fmt::Debug for AssertionResponseJson {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AssertionResponseJson")
            .field("authenticator_data", &self.authenticator_data.len())
            .field("client_data_json", &self.client_data_json.len())
            .field("signature", &self.signature.len())
            .finish_non_exhaustive()
    }
}

impl std::fmt::Debug for AssertionJson {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AssertionJson")
            .field("id", &self.id)
            .finish_non_exhaustive()
    }
}

/// An assertion's fields decoded.
#[derive(Clone, PartialEq, Eq)]
pub struct Presented {
    pub credential_id: Vec<u8>,
    pub authenticator_data: Vec<u8>,
    pub client_data_json: Vec<u8>,
    pub signature: Vec<u8>,
    pub user_handle: Option<Vec<u8>>,
}

impl std::fmt::Debug for Presented {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Presented")
            .field("credential_id", &hex::encode(&self.credential_id))
            .finish_non_exhaustive()
    }
}

impl Presented {
    /// Decode what the page posted (each field bounded before decoding).
    pub fn from_json(j: &AssertionJson) -> Result<Presented, Error> {
        let r = &j.response;
        Ok(Presented {
            credential_id: unb64("rawId", &j.id, webauthn::MAX_CREDENTIAL_ID_LEN)?,
            authenticator_data: unb64(
                "authenticatorData",
                &r.authenticator_data,
                webauthn::MAX_AUTHENTICATOR_DATA_LEN,
            )?,
            client_data_json: unb64(
                "clientDataJSON",
                &r.client_data_json,
                webauthn::MAX_CLIENT_DATA_LEN,
            )?,
            signature: unb64("signature", &r.signature, webauthn::MAX_SIGNATURE_LEN)?,
            user_handle: r
                .user_handle
                .as_deref()
                .filter(|h| !h.is_empty())
                .map(|h| unb64("userHandle", h, webauthn::MAX_USER_HANDLE_LEN))
                .transpose()?,
        })
    }

    /// As `talos_certs::webauthn` takes it.
    pub fn assertion(&self) -> Assertion<'_> {
        Assertion {
            credential_id: &self.credential_id,
            authenticator_data: &self.authenticator_data,
            client_data_json: &self.client_data_json,
            signature: &self.signature,
            user_handle: self.user_handle.as_deref(),
        }
    }
}

/// What `navigator.credentials.create` gave, as the page posts it.
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RegistrationJson {
    /// `rawId`.
    pub id: String,
    pub response: RegistrationResponseJson,
}

/// `AuthenticatorAttestationResponse`, each buffer base64url.
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RegistrationResponseJson {
    pub attestation_object: String,
    #[serde(rename = "clientDataJSON")]
    pub client_data_json: String,
}

impl std::fmt::Debug for RegistrationResponseJson {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RegistrationResponseJson")
            .field("attestation_object", &self.attestation_object.len())
            .field("client_data_json", &self.client_data_json.len())
            .finish()
    }
}

impl std::fmt::Debug for RegistrationJson {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RegistrationJson")
            .field("id", &self.id)
            .finish_non_exhaustive()
    }
}

/// Check that `person`'s passkey `credential` signed `presented` over
/// `challenge`, and store its new sign count: the check every signed
/// request shares (sign-in, a decision, a command). The user handle, when
/// given, must be the person's.
pub fn check_assertion(
    tx: &Tx<'_>,
    rp: &RelyingParty,
    person: &Person,
    credential: &Passkey,
    challenge: &[u8],
    presented: &Presented,
    now: SystemTime,
) -> Result<webauthn::Verified, Error> {
    if let Some(handle) = &presented.user_handle {
        if person.user_handle.as_deref() != Some(handle.as_slice()) {
            return Err(refused_assertion(
                webauthn::AssertionError::UnknownCredential(
                    "the user handle is not the passkey's person's",
                ),
            ));
        }
    }
    let expected = Expected {
        challenge,
        rp_id: rp.rp_id(),
        origin: rp.origin(),
    };
    let stored = StoredCredential {
        id: &credential.credential_id,
        public_key_cose: &credential.public_key_cose,
        sign_count: credential.sign_count,
    };
    let verified =
        verify_assertion(&expected, &stored, &presented.assertion()).map_err(refused_assertion)?;
    tx.passkey_used(
        &credential.credential_id,
        verified.sign_count,
        verified.flags.backed_up(),
        &at(now),
    )?;
    Ok(verified)
}

/// Find `person`'s passkey that made `presented` (`unknown_credential`
/// when it is none of theirs).
pub fn own_passkey(tx: &Tx<'_>, person: &str, presented: &Presented) -> Result<Passkey, Error> {
    let passkeys = tx.passkeys_of(person)?;
    webauthn::find_credential(&passkeys, &presented.credential_id, |p| &p.credential_id)
        .cloned()
        .map_err(refused_assertion)
}

/// Issue a challenge of `purpose` (see the module docs); its handle and
/// bytes. Run in the caller's write transaction.
pub fn issue(tx: &Tx<'_>, mut c: Challenge, now: SystemTime) -> Result<Challenge, Error> {
    let stamp = at(now);
    tx.prune_challenges(&stamp)?;
    let (outstanding, _) = tx.challenges_outstanding(&c.source)?;
    if outstanding >= MAX_CHALLENGES {
        return Err(Error::ChallengesFull { outstanding });
    }
    c.created_at = stamp;
    c.expires_at = at(now + CHALLENGE_LIFE);
    tx.insert_challenge(&c)?;
    Ok(c)
}

/// A new challenge record to [`issue`]: a random handle and 32 random
/// bytes, for `purpose`, asked from `source`.
pub fn fresh(purpose: ChallengePurpose, source: &str) -> Result<Challenge, Error> {
    Ok(Challenge {
        id: b64(&random(16)?),
        purpose,
        challenge: random(32)?.to_vec(),
        person: None,
        enrolment: None,
        command: None,
        session_id: None,
        source: source.to_owned(),
        created_at: String::new(),
        expires_at: String::new(),
    })
}

/// Take challenge `id` for `purpose` (in its own committed transaction: it
/// is used up whatever the answer), refusing one of another purpose or
/// past its life.
pub fn take(
    store: &mut Store,
    id: &str,
    purpose: ChallengePurpose,
    now: SystemTime,
) -> Result<Challenge, Error> {
    if id.is_empty() || id.len() > 64 {
        return Err(invalid_challenge("no such challenge"));
    }
    let c = store
        .write(|tx| tx.take_challenge(id))?
        .ok_or_else(|| invalid_challenge("no such challenge: it was used, or never issued"))?;
    if c.purpose != purpose {
        return Err(invalid_challenge(
            "the challenge was issued for something else",
        ));
    }
    if parse_at(&c.expires_at) <= now {
        return Err(invalid_challenge(
            "the challenge expired: its two minutes are over",
        ));
    }
    Ok(c)
}

/// The sign-in counters' scopes for `source`.
fn scopes(source: &str) -> [(String, u32, &'static str); 2] {
    [
        (
            format!("addr:{source}"),
            SIGN_IN_PER_SOURCE,
            "from this address",
        ),
        ("all".to_owned(), SIGN_IN_OVERALL, "in all"),
    ]
}

/// Count one attempt from `source`, or refuse it when a counter is full
/// (nothing counted then).
pub fn count_attempt(tx: &Tx<'_>, source: &str, now: SystemTime) -> Result<(), Error> {
    tx.prune_sign_in_failures(&at(now.checked_sub(SIGN_IN_WINDOW).unwrap_or(now)))?;
    let mut next = Vec::new();
    for (scope, limit, said) in scopes(source) {
        let (start, n) = match tx.sign_in_failures(&scope)? {
            Some((start, n)) if parse_at(&start) + SIGN_IN_WINDOW > now => (parse_at(&start), n),
            _ => (now, 0),
        };
        if n >= limit {
            let retry = (start + SIGN_IN_WINDOW)
                .duration_since(now)
                .unwrap_or_default()
                .as_secs()
                .max(1);
            return Err(Error::SignInLimited {
                scope: said,
                retry_after_secs: retry,
            });
        }
        next.push((scope, start, n + 1));
    }
    for (scope, start, n) in next {
        tx.set_sign_in_failures(&scope, &at(start), n)?;
    }
    Ok(())
}

/// A sign-in from `source` succeeded: its attempt is taken back.
fn count_success(tx: &Tx<'_>, source: &str, now: SystemTime) -> Result<(), Error> {
    for (scope, _, _) in scopes(source) {
        if let Some((start, n)) = tx.sign_in_failures(&scope)? {
            if parse_at(&start) + SIGN_IN_WINDOW > now {
                tx.set_sign_in_failures(&scope, &start, n.saturating_sub(1))?;
            }
        }
    }
    Ok(())
}

/// The `allowCredentials`/`excludeCredentials` list of passkeys.
pub fn descriptors(passkeys: &[Passkey]) -> serde_json::Value {
    passkeys
        .iter()
        .map(|p| serde_json::json!({"type": "public-key", "id": b64(&p.credential_id)}))
        .collect()
}

/// The enrolment a link's `token` names, if it may still be used.
fn open_enrolment(
    tx: &Tx<'_>,
    token: &str,
    now: SystemTime,
) -> Result<crate::store::Enrolment, Error> {
    let e = tx
        .enrolment(&token_hash(token))?
        .ok_or(Error::EnrolmentUnknown)?;
    if let Some(used_at) = e.used_at {
        return Err(Error::EnrolmentUsed { used_at });
    }
    if parse_at(&e.expires_at) <= now {
        return Err(Error::EnrolmentExpired {
            expired_at: e.expires_at,
        });
    }
    Ok(e)
}

/// Start an enrolment with a link's `token`: the creation options the page
/// hands `navigator.credentials.create` (`publicKey`, buffers base64url),
/// the challenge's handle, and whom and what role the link is for. A
/// token no open enrolment has counts as a failed sign-in attempt.
pub fn enrol_begin(
    store: &mut Store,
    rp: &RelyingParty,
    token: &str,
    source: &str,
    now: SystemTime,
) -> Result<serde_json::Value, Error> {
    if token.is_empty() || token.len() > 128 {
        store.write(|tx| count_attempt(tx, source, now))?;
        return Err(Error::EnrolmentUnknown);
    }
    let found = store.read(|tx| open_enrolment(tx, token, now));
    let enrolment = match found {
        Ok(e) => e,
        Err(
            e @ (Error::EnrolmentUnknown
            | Error::EnrolmentExpired { .. }
            | Error::EnrolmentUsed { .. }),
        ) => {
            store.write(|tx| count_attempt(tx, source, now))?;
            return Err(e);
        }
        Err(e) => return Err(e),
    };
    store.write(|tx| {
        let person = tx
            .person(&enrolment.person)?
            .ok_or(Error::EnrolmentUnknown)?;
        let handle = person
            .user_handle
            .clone()
            .ok_or_else(|| Error::Store(format!("{} has no user handle", person.name)))?;
        let mut c = fresh(ChallengePurpose::Enrol, source)?;
        c.person = Some(person.name.clone());
        c.enrolment = Some(enrolment.token_sha256.clone());
        let c = issue(tx, c, now)?;
        let passkeys = tx.passkeys_of(&person.name)?;
        Ok(serde_json::json!({
            "challenge_id": c.id,
            "person": person.name,
            "role": person.role,
            "expires_at": enrolment.expires_at,
            "publicKey": {
                "rp": {"id": rp.rp_id(), "name": RP_NAME},
                "user": {
                    "id": b64(&handle),
                    "name": person.name,
                    "displayName": person.name,
                },
                "challenge": b64(&c.challenge),
                "pubKeyCredParams": ALGORITHMS
                    .iter()
                    .map(|alg| serde_json::json!({"type": "public-key", "alg": alg}))
                    .collect::<Vec<_>>(),
                "timeout": CEREMONY_TIMEOUT.as_millis() as u64,
                "excludeCredentials": descriptors(&passkeys),
                "authenticatorSelection": {
                    "residentKey": "required",
                    "requireResidentKey": true,
                    "userVerification": "required",
                },
                "attestation": "none",
            },
        }))
    })
}

/// A passkey enrolled.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EnrolledPasskey {
    pub person: String,
    pub role: Role,
    pub passkey: Passkey,
}

/// Finish an enrolment: check the browser's answer to challenge
/// `challenge_id` for the link's `token`, store the passkey and mark the
/// link used (one transaction).
pub fn enrol_finish(
    store: &mut Store,
    rp: &RelyingParty,
    token: &str,
    challenge_id: &str,
    answer: &RegistrationJson,
    now: SystemTime,
) -> Result<EnrolledPasskey, Error> {
    let c = take(store, challenge_id, ChallengePurpose::Enrol, now)?;
    if c.enrolment.as_deref() != Some(token_hash(token).as_str()) {
        return Err(invalid_challenge(
            "the challenge was issued for another enrolment link",
        ));
    }
    let attestation_object = unb64(
        "attestationObject",
        &answer.response.attestation_object,
        MAX_FIELD,
    )?;
    let client_data_json = unb64(
        "clientDataJSON",
        &answer.response.client_data_json,
        webauthn::MAX_CLIENT_DATA_LEN,
    )?;
    let expected = Expected {
        challenge: &c.challenge,
        rp_id: rp.rp_id(),
        origin: rp.origin(),
    };
    let credential = verify_registration(&expected, &attestation_object, &client_data_json)
        .map_err(refused_registration)?;
    let raw_id = unb64("rawId", &answer.id, webauthn::MAX_CREDENTIAL_ID_LEN)?;
    if raw_id != credential.id {
        return Err(Error::PasskeyRefused {
            reason: "malformed",
            detail: "rawId is not the credential id the authenticator data carries".into(),
        });
    }
    store.write(|tx| {
        let enrolment = open_enrolment(tx, token, now)?;
        let person = tx
            .person(&enrolment.person)?
            .filter(|p| p.role == enrolment.role)
            .ok_or(Error::EnrolmentUnknown)?;
        let passkey = Passkey {
            credential_id: credential.id.clone(),
            person: person.name.clone(),
            public_key_cose: credential.public_key_cose.clone(),
            alg: credential.alg.as_str().to_owned(),
            sign_count: credential.sign_count,
            aaguid: hex::encode(credential.aaguid),
            backup_eligible: credential.backup_eligible,
            backed_up: credential.backed_up,
            attestation: credential.attestation.as_str().to_owned(),
            created_at: at(now),
            last_used_at: None,
        };
        tx.insert_passkey(&passkey)?;
        if !tx.use_enrolment(&enrolment.token_sha256, &at(now))? {
            return Err(Error::EnrolmentUsed { used_at: at(now) });
        }
        Ok(EnrolledPasskey {
            person: person.name,
            role: person.role,
            passkey,
        })
    })
}

/// Start a sign-in from `source` (counted: see the module docs): the
/// request options for `navigator.credentials.get` and the challenge's
/// handle.
pub fn sign_in_begin(
    store: &mut Store,
    rp: &RelyingParty,
    source: &str,
    now: SystemTime,
) -> Result<serde_json::Value, Error> {
    store.write(|tx| {
        count_attempt(tx, source, now)?;
        let c = issue(tx, fresh(ChallengePurpose::SignIn, source)?, now)?;
        Ok(serde_json::json!({
            "challenge_id": c.id,
            "publicKey": {
                "challenge": b64(&c.challenge),
                "rpId": rp.rp_id(),
                "timeout": CEREMONY_TIMEOUT.as_millis() as u64,
                "userVerification": "required",
                "allowCredentials": [],
            },
        }))
    })
}

/// Finish a sign-in: the browser's answer to challenge `challenge_id`
/// checked (see the module docs), a web session opened.
pub fn sign_in_finish(
    store: &mut Store,
    rp: &RelyingParty,
    challenge_id: &str,
    answer: &AssertionJson,
    source: &str,
    now: SystemTime,
) -> Result<Opened, Error> {
    let c = take(store, challenge_id, ChallengePurpose::SignIn, now)?;
    let presented = Presented::from_json(answer)?;
    store.write(|tx| {
        let passkey = tx.passkey(&presented.credential_id)?.ok_or_else(|| {
            refused_assertion(webauthn::AssertionError::UnknownCredential(
                "no enrolled passkey has this credential id",
            ))
        })?;
        let person = tx.person(&passkey.person)?.ok_or(Error::NotSignedIn)?;
        check_assertion(tx, rp, &person, &passkey, &c.challenge, &presented, now)?;
        count_success(tx, source, now)?;
        sessions::open(tx, &person, &passkey.credential_id, source, now)
    })
}
