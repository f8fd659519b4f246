//! What a person signs with their passkey beyond sign-in: a decision on a
//! card, and a command on a session (Revoke All). Each is checked against
//! a challenge the server computes itself, never one the page sends, and
//! the verified assertion is recorded whole with what it authorised
//! ([`SignedByPasskey`]), so the gateway and an auditor can verify it
//! again.
//!
//! # A decision
//!
//! The page runs `navigator.credentials.get` with the challenge
//! `talos_certs::webauthn::decision_challenge(card digest, verdict)` and
//! the person's own passkeys as `allowCredentials`, and posts the
//! assertion with the verdict. The server, inside the relay's decision
//! transaction ([`crate::relay::decide_signed`]), after the relay's own
//! checks (the card pending and in time, the person named by it and still
//! by its rule, the session running):
//!
//! 1. finds the signing passkey among the **person's own**
//!    (`unknown_credential` for another person's, even an approver of the
//!    same card);
//! 2. checks the user handle, when given, is the person's;
//! 3. computes the challenge from the card's stored digest and the
//!    **posted** verdict, so an assertion made for Approve posted as
//!    Decline fails (`challenge_mismatch`), as does one for another card;
//! 4. verifies the assertion (`verify_assertion`: type `webauthn.get`, the
//!    origin byte for byte, no cross-origin frame, the rp id hash, UP, UV,
//!    the signature, the sign count) and stores the new sign count;
//!
//! and only then signs the relay's decision and delivers it, recording the
//! assertion beside it in the same transaction.
//!
//! # A command (Revoke All)
//!
//! An operator's page asks for a nonce: 16 random bytes, issued to that
//! person for that command on that session, single use, good for two
//! minutes (a challenge row of purpose `command`). The page signs
//! `command_challenge("revoke_all", session id, nonce hex)`; the server
//! takes the nonce (used up whatever follows), checks it was issued to
//! this person for this command and session, recomputes the challenge and
//! verifies the assertion against the person's own passkeys. The command
//! then runs as any Revoke All does ([`Lifecycle::revoke_all`]), its
//! requester recorded as verified: the person, and the assertion (which
//! names the credential, and carries the public key it verified under).
//!
//! An API caller (`POST /v1/sandboxes/{id}/revoke-all`) proves an
//! operator either way: the same signed-in session and nonce, or an
//! operator's client certificate under the operator CA, recorded
//! `verified_by: client_certificate` with the certificate's fingerprint.
//! Every way in runs through one function, [`revoke_all`] ([`RevokeBy`]).

use std::time::SystemTime;

use talos_certs::webauthn::{command_challenge, decision_challenge};
use talos_certs::{GatewayKey, Verdict};

use super::ceremony::{self, check_assertion, own_passkey, Presented};
use super::rp::{at, b64, RelyingParty};
use crate::error::Error;
use crate::lifecycle::{Lifecycle, Transition};
use crate::link::{GatewayLink, ReportVerifier};
use crate::model::Role;
use crate::relay::{self, Decided};
use crate::store::{
    ChallengePurpose, ClientCertificate, Passkey, Requester, RequesterKind, SignedByPasskey, Store,
    Tx,
};

/// The command word Revoke All signs.
pub const REVOKE_ALL: &str = "revoke_all";

/// The record of a verified assertion.
fn record(
    rp: &RelyingParty,
    person: &str,
    passkey: &Passkey,
    presented: &Presented,
    challenge: &[u8],
    sign_count: u32,
    now: SystemTime,
) -> SignedByPasskey {
    SignedByPasskey {
        person: person.to_owned(),
        credential_id: b64(&passkey.credential_id),
        authenticator_data: b64(&presented.authenticator_data),
        client_data_json: b64(&presented.client_data_json),
        signature: b64(&presented.signature),
        user_handle: presented.user_handle.as_deref().map(b64),
        sign_count,
        rp_id: rp.rp_id().to_owned(),
        origin: rp.origin().to_owned(),
        challenge: b64(challenge),
        nonce: None,
        verified_at: at(now),
        public_key_cose: Some(b64(&passkey.public_key_cose)),
        alg: Some(passkey.alg.clone()),
    }
}

/// Check `person`'s assertion over `challenge` with one of their own
/// passkeys, in `tx`; the record to keep.
fn verify_own(
    tx: &Tx<'_>,
    rp: &RelyingParty,
    person: &str,
    challenge: &[u8],
    presented: &Presented,
    now: SystemTime,
) -> Result<SignedByPasskey, Error> {
    let who = tx.person(person)?.ok_or(Error::NotSignedIn)?;
    let passkey = own_passkey(tx, person, presented)?;
    let verified = check_assertion(tx, rp, &who, &passkey, challenge, presented, now)?;
    Ok(record(
        rp,
        person,
        &passkey,
        presented,
        challenge,
        verified.sign_count,
        now,
    ))
}

/// Decide card `card_id` as `person` with `verdict`, on the strength of
/// their passkey's assertion `presented` (see the module docs).
#[allow(clippy::too_many_arguments)]
pub fn decide(
    store: &mut Store,
    link: &dyn GatewayLink,
    key: &GatewayKey,
    rp: &RelyingParty,
    person: &str,
    card_id: &str,
    verdict: Verdict,
    presented: &Presented,
    now: SystemTime,
) -> Result<Decided, Error> {
    relay::decide_signed(store, link, key, card_id, person, verdict, |tx, card| {
        let challenge = decision_challenge(&card.digest, verdict);
        verify_own(tx, rp, person, &challenge, presented, now).map(Some)
    })
}

/// Issue `person` a nonce for Revoke All on session `session_id`: the
/// request options for `navigator.credentials.get` (the challenge computed
/// from it, the person's passkeys) and the nonce. Operators only.
pub fn revoke_all_begin(
    store: &mut Store,
    rp: &RelyingParty,
    person: &str,
    role: Role,
    session_id: &str,
    source: &str,
    now: SystemTime,
) -> Result<serde_json::Value, Error> {
    if role != Role::Operator {
        return Err(not_an_operator());
    }
    store.write(|tx| {
        if tx.session(session_id)?.is_none() {
            return Err(Error::SandboxNotFound {
                id: session_id.chars().take(100).collect(),
            });
        }
        let mut c = ceremony::fresh(ChallengePurpose::Command, source)?;
        c.challenge.truncate(16);
        c.id = hex::encode(&c.challenge);
        c.person = Some(person.to_owned());
        c.command = Some(REVOKE_ALL.to_owned());
        c.session_id = Some(session_id.to_owned());
        let c = ceremony::issue(tx, c, now)?;
        let challenge = command_challenge(REVOKE_ALL, session_id, &c.id);
        Ok(serde_json::json!({
            "nonce": c.id,
            "command": REVOKE_ALL,
            "session_id": session_id,
            "publicKey": {
                "challenge": b64(&challenge),
                "rpId": rp.rp_id(),
                "timeout": ceremony::CEREMONY_TIMEOUT.as_millis() as u64,
                "userVerification": "required",
                "allowCredentials": ceremony::descriptors(&tx.passkeys_of(person)?),
            },
        }))
    })
}

/// Who asks for a Revoke All, and what proves it: the two ways in, both
/// run by [`revoke_all`].
pub enum RevokeBy<'a> {
    /// A signed-in person (the web app's page, or an API caller with the
    /// person's browser session): their passkey's assertion over
    /// `command_challenge("revoke_all", session id, nonce)`, with the
    /// nonce [`revoke_all_begin`] issued them.
    Passkey {
        person: &'a str,
        role: Role,
        nonce: &'a str,
        presented: &'a Presented,
    },
    /// An operator's client certificate, verified under the operator CA
    /// on the request's TLS connection
    /// ([`crate::identity::OperatorTrust::operator`]).
    ClientCertificate(ClientCertificate),
}

impl std::fmt::Debug for RevokeBy<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RevokeBy::Passkey { person, role, .. } => f
                .debug_struct("RevokeBy::Passkey")
                .field("person", person)
                .field("role", role)
                .finish_non_exhaustive(),
            RevokeBy::ClientCertificate(c) => f
                .debug_struct("RevokeBy::ClientCertificate")
                .field("operator", &c.operator)
                .field("sha256", &c.sha256)
                .finish_non_exhaustive(),
        }
    }
}

/// Revoke All on session `session_id`, as `by` asks and proves (see the
/// module docs): the lifecycle's transition, its requester recorded as
/// verified, with the proof. A certificate's operator must not be a
/// person of another role in the store (an approver of that name).
#[allow(clippy::too_many_arguments)]
pub fn revoke_all(
    store: &mut Store,
    link: &dyn GatewayLink,
    verifier: &dyn ReportVerifier,
    rp: &RelyingParty,
    session_id: &str,
    by: RevokeBy<'_>,
    now: SystemTime,
) -> Result<Transition, Error> {
    let requester = match by {
        RevokeBy::Passkey {
            person,
            role,
            nonce,
            presented,
        } => {
            if role != Role::Operator {
                return Err(not_an_operator());
            }
            let c = ceremony::take(store, nonce, ChallengePurpose::Command, now)?;
            if c.person.as_deref() != Some(person)
                || c.command.as_deref() != Some(REVOKE_ALL)
                || c.session_id.as_deref() != Some(session_id)
            {
                return Err(Error::ChallengeInvalid {
                    reason: "the nonce was issued for another person, command or session".into(),
                });
            }
            let challenge = command_challenge(REVOKE_ALL, session_id, nonce);
            let mut signed =
                store.write(|tx| verify_own(tx, rp, person, &challenge, presented, now))?;
            signed.nonce = Some(nonce.to_owned());
            Requester::verified(RequesterKind::Operator, signed)
        }
        RevokeBy::ClientCertificate(cert) => {
            let known = store.read(|tx| tx.person(&cert.operator))?;
            if known.is_some_and(|p| p.role != Role::Operator) {
                return Err(not_an_operator());
            }
            Requester::by_certificate(cert)
        }
    };
    let mut life = Lifecycle::new(store, link, verifier).with_requester(requester);
    life.revoke_all(session_id)
}

fn not_an_operator() -> Error {
    Error::NotPermitted {
        what: "Revoke All",
        needs: Role::Operator.as_str(),
    }
}
