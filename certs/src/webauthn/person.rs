//! A person's decision, checked where it counts: [`verify_person`] takes a
//! [`Decision`] the relay signed (already checked under the relay's key by
//! [`verify_decision`](crate::verify_decision)), the digest of the card the
//! checker computed itself, the keys of the approvers the session's open
//! listed and the relying party, and says which person decided, or why
//! nobody did.
//!
//! # Checks, in order (the first failure is the refusal)
//!
//! 1. The decision carries an assertion (`no_assertion`), of base64url
//!    fields without padding (`malformed`).
//! 2. When it carries its card, the card's own digest
//!    ([`proposal_digest`] over its [`sentence`]) is the checker's
//!    (`challenge_mismatch`: the person saw another card).
//! 3. The credential id is exactly one of the listed keys
//!    (`unknown_credential`), whose owner is one of the approvers the rule
//!    names (`unknown_credential`) and is the decision's `approver`
//!    (`unknown_credential`: the relay named someone else than the key's
//!    owner).
//! 4. [`verify_assertion`] with the challenge
//!    [`decision_challenge`]`(card digest, verdict)`, the rp id and the
//!    origin: type, challenge (another card or the other verdict:
//!    `challenge_mismatch`), origin, rp id hash, UP, UV, the signature and
//!    the sign count, under its names.
//!
//! Nothing here is secret: keys are public, and a signature over a public
//! challenge gives nothing away.

use std::fmt;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;

use super::{
    decision_challenge, find_credential, lower_hex, verify_assertion, Assertion, AssertionError,
    ByteCount, Expected, StoredCredential, MAX_AUTHENTICATOR_DATA_LEN, MAX_CLIENT_DATA_LEN,
    MAX_CREDENTIAL_ID_LEN, MAX_SIGNATURE_LEN, MAX_USER_HANDLE_LEN,
};
use crate::approval::{proposal_digest, sentence, Decision};

/// One enrolled passkey of an approver, as the session's open listed it.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct ApproverKey<'a> {
    /// The person's name (an approver a Lock rule may name).
    pub owner: &'a str,
    /// The credential id.
    pub credential_id: &'a [u8],
    /// The COSE public key, as the store keeps it.
    pub public_key_cose: &'a [u8],
    /// The highest sign count seen so far for this key (the store's at the
    /// session's open, then the checker's own as decisions arrive).
    pub sign_count: u32,
}

impl fmt::Debug for ApproverKey<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ApproverKey")
            .field("owner", &self.owner)
            .field("credential_id", &lower_hex(self.credential_id))
            .field("public_key_cose", &ByteCount(self.public_key_cose.len()))
            .field("sign_count", &self.sign_count)
            .finish()
    }
}

/// The relying party the web app serves: its rp id and exact origin.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RelyingParty<'a> {
    /// A DNS name, e.g. `people.talos.test`.
    pub rp_id: &'a str,
    /// E.g. `https://people.talos.test:8443`, compared byte for byte.
    pub origin: &'a str,
}

/// Who decided, as [`verify_person`] found it.
#[derive(Clone, PartialEq, Eq)]
pub struct PersonVerified {
    /// The key's owner (also the decision's `approver`).
    pub person: String,
    /// The credential id the person signed with.
    pub credential_id: Vec<u8>,
    /// The authenticator's new sign count: the checker keeps it as the
    /// highest seen for that key.
    pub sign_count: u32,
}

impl fmt::Debug for PersonVerified {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PersonVerified")
            .field("person", &self.person)
            .field("credential_id", &lower_hex(&self.credential_id))
            .field("sign_count", &self.sign_count)
            .finish()
    }
}

/// Check the person's assertion a decision carries: see the module's
/// checks. `card_digest` is the digest of the card the checker holds
/// (computed by itself, never taken from the decision); `keys` every
/// listed key of every approver; `named` the approvers the card's rule
/// names.
///
/// # Limits
///
/// Each field bounded before it is decoded (WebAuthn's `MAX_*_LEN`, in
/// base64url); one comparison per listed key; one signature check.
pub fn verify_person(
    decision: &Decision,
    card_digest: &str,
    keys: &[ApproverKey<'_>],
    named: &[String],
    rp: &RelyingParty<'_>,
) -> Result<PersonVerified, AssertionError> {
    let Some(assertion) = &decision.assertion else {
        return Err(AssertionError::NoAssertion);
    };
    let credential_id = field(
        &assertion.credential_id,
        MAX_CREDENTIAL_ID_LEN,
        "the credential id is not base64url of at most 1,023 bytes",
    )?;
    let authenticator_data = field(
        &assertion.authenticator_data,
        MAX_AUTHENTICATOR_DATA_LEN,
        "the authenticator data is not base64url of at most 4 KiB",
    )?;
    let client_data_json = field(
        &assertion.client_data_json,
        MAX_CLIENT_DATA_LEN,
        "clientDataJSON is not base64url of at most 4 KiB",
    )?;
    let signature = field(
        &assertion.signature,
        MAX_SIGNATURE_LEN,
        "the signature is not base64url of at most 1,024 bytes",
    )?;
    let user_handle = match &assertion.user_handle {
        Some(h) => Some(field(
            h,
            MAX_USER_HANDLE_LEN,
            "the user handle is not base64url of at most 64 bytes",
        )?),
        None => None,
    };
    if let Some(card) = &decision.card {
        if proposal_digest(card, &sentence(card)) != card_digest {
            return Err(AssertionError::ChallengeMismatch);
        }
    }
    let key = find_credential(keys, &credential_id, |k| k.credential_id)?;
    if !named.iter().any(|n| n == key.owner) {
        return Err(AssertionError::UnknownCredential(
            "the key's owner is not an approver the rule names",
        ));
    }
    if decision.approver != key.owner {
        return Err(AssertionError::UnknownCredential(
            "the key's owner is not the decision's approver",
        ));
    }
    let challenge = decision_challenge(card_digest, decision.decision);
    let expected = Expected {
        challenge: &challenge,
        rp_id: rp.rp_id,
        origin: rp.origin,
    };
    let stored = StoredCredential {
        id: key.credential_id,
        public_key_cose: key.public_key_cose,
        sign_count: key.sign_count,
    };
    let verified = verify_assertion(
        &expected,
        &stored,
        &Assertion {
            credential_id: &credential_id,
            authenticator_data: &authenticator_data,
            client_data_json: &client_data_json,
            signature: &signature,
            user_handle: user_handle.as_deref(),
        },
    )?;
    Ok(PersonVerified {
        person: key.owner.to_owned(),
        credential_id,
        sign_count: verified.sign_count,
    })
}

/// A base64url field (no padding) of at most `max` bytes decoded.
fn field(text: &str, max: usize, why: &'static str) -> Result<Vec<u8>, AssertionError> {
    // Four characters per three bytes, and no more.
    if text.len() > max.div_ceil(3) * 4 {
        return Err(AssertionError::Malformed(why));
    }
    let bytes = URL_SAFE_NO_PAD
        .decode(text)
        .map_err(|_| AssertionError::Malformed(why))?;
    if bytes.len() > max {
        return Err(AssertionError::Malformed(why));
    }
    Ok(bytes)
}
