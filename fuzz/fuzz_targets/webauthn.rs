//! Fuzzes people's passkey checks (`talos_certs::webauthn`): a
//! registration (`attestationObject`, `clientDataJSON`), an assertion
//! (a COSE key, authenticator data, `clientDataJSON`, a signature), or a
//! COSE key alone, for the rp id `example.org` and the origin
//! `https://example.org` (those of the W3C test vectors the seeds in
//! `fuzz/seeds/webauthn/` come from).
//!
//! Input: a mode byte (0 registration, 1 assertion, else a key), then
//! length-prefixed parts (one byte for the challenge, two big-endian bytes
//! for the others), the last part taking the rest:
//!
//! - registration: challenge, attestationObject, clientDataJSON;
//! - assertion: challenge, COSE key, authenticatorData, clientDataJSON,
//!   signature.
//!
//! Checks: never a panic; every refusal has one of the documented names;
//! the same input gets the same verdict; an accepted registration has a
//! credential id of 1 to 1,023 bytes and a key that `check_public_key`
//! accepts with the same algorithm, and is refused once its object loses
//! its last byte; an accepted assertion has UP and UV, and the same
//! assertion again, its count now stored, is refused as
//! `sign_count_replayed` unless its count is 0.

#![no_main]

use libfuzzer_sys::fuzz_target;
use talos_certs::webauthn::{
    check_public_key, verify_assertion, verify_registration, Assertion, AssertionError, Expected,
    RegistrationError, StoredCredential,
};

/// Splits off length-prefixed parts.
struct Parts<'a>(&'a [u8]);

impl<'a> Parts<'a> {
    fn take(&mut self, len_bytes: usize) -> Option<&'a [u8]> {
        let (len, rest) = self.0.split_at_checked(len_bytes)?;
        let len = len.iter().fold(0usize, |n, &b| n << 8 | usize::from(b));
        let (part, rest) = rest.split_at_checked(len)?;
        self.0 = rest;
        Some(part)
    }
}

fn expected(challenge: &[u8]) -> Expected<'_> {
    Expected {
        challenge,
        rp_id: "example.org",
        origin: "https://example.org",
    }
}

fn registration(mut parts: Parts<'_>) -> Option<()> {
    let challenge = parts.take(1)?;
    let object = parts.take(2)?;
    let client = parts.0;
    let e = expected(challenge);
    let verdict = verify_registration(&e, object, client);
    assert_eq!(verdict, verify_registration(&e, object, client));
    match verdict {
        Ok(credential) => {
            assert!((1..=1023).contains(&credential.id.len()));
            assert_eq!(
                check_public_key(&credential.public_key_cose),
                Ok(credential.alg)
            );
            let cut = &object[..object.len() - 1];
            assert!(verify_registration(&e, cut, client).is_err());
        }
        Err(e) => assert!(RegistrationError::NAMES.contains(&e.as_str()), "{e:?}"),
    }
    Some(())
}

fn assertion(mut parts: Parts<'_>) -> Option<()> {
    let challenge = parts.take(1)?;
    let key = parts.take(2)?;
    let authenticator_data = parts.take(2)?;
    let client_data_json = parts.take(2)?;
    let signature = parts.0;
    let e = expected(challenge);
    let id = b"credential";
    let mut stored = StoredCredential {
        id,
        public_key_cose: key,
        sign_count: 0,
    };
    let assertion = Assertion {
        credential_id: id,
        authenticator_data,
        client_data_json,
        signature,
        user_handle: None,
    };
    let verdict = verify_assertion(&e, &stored, &assertion);
    assert_eq!(verdict, verify_assertion(&e, &stored, &assertion));
    match verdict {
        Ok(verified) => {
            assert!(verified.flags.user_present() && verified.flags.user_verified());
            assert!(check_public_key(key).is_ok());
            stored.sign_count = verified.sign_count;
            let again = verify_assertion(&e, &stored, &assertion);
            if verified.sign_count == 0 {
                assert_eq!(again, Ok(verified));
            } else {
                assert_eq!(again.map_err(|e| e.as_str()), Err("sign_count_replayed"));
            }
        }
        Err(e) => {
            assert!(AssertionError::NAMES.contains(&e.as_str()), "{e:?}");
            assert_ne!(e, AssertionError::NoAssertion);
        }
    }
    Some(())
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    match mode {
        0 => {
            let _ = registration(Parts(rest));
        }
        1 => {
            let _ = assertion(Parts(rest));
        }
        _ => {
            if let Ok(alg) = check_public_key(rest) {
                assert_eq!(check_public_key(rest), Ok(alg));
            }
        }
    }
});
