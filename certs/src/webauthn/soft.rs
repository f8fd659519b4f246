//! A software authenticator for tests (feature `test-util`; never in the
//! gateway or the control plane's binaries).
//!
//! It holds one credential (P-256, Ed25519 or RSA-2048, made by aws-lc),
//! and answers `create` and `get` ceremonies the way a browser and an
//! authenticator together would: `clientDataJSON`, authenticator data,
//! an attestation object (`none` or `packed` self-attestation), and a
//! signature in WebAuthn's encoding. Every field a test may want wrong is
//! a field of [`Ceremony`]: the type, challenge, origin and rp id, the
//! flags, the sign count, `crossOrigin`, extra client data, extensions.
//! Another person's key is another [`Authenticator`].
//!
//! ```
//! use talos_certs::webauthn::soft::{Authenticator, Ceremony};
//! use talos_certs::webauthn::{verify_assertion, verify_registration, CoseAlgorithm, Expected};
//!
//! let expected = Expected {
//!     challenge: &[7; 32],
//!     rp_id: "people.talos.test",
//!     origin: "https://people.talos.test",
//! };
//! let phone = Authenticator::new(CoseAlgorithm::Es256);
//! let made = phone.register(&Ceremony::create(&expected));
//! let credential = verify_registration(&expected, &made.attestation_object, &made.client_data_json).unwrap();
//!
//! let signed = phone.assert(&Ceremony::get(&expected).sign_count(1));
//! let verified = verify_assertion(&expected, &credential.stored(), &signed.as_assertion()).unwrap();
//! assert_eq!(verified.sign_count, 1);
//! ```

use std::fmt;

use aws_lc_rs::digest::{digest, SHA256};
use aws_lc_rs::rand::{SecureRandom as _, SystemRandom};
use aws_lc_rs::rsa::KeySize;
use aws_lc_rs::signature::{
    EcdsaKeyPair, Ed25519KeyPair, KeyPair as _, RsaKeyPair, ECDSA_P256_SHA256_ASN1_SIGNING,
    RSA_PKCS1_SHA256,
};
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;

use super::{Assertion, CoseAlgorithm, Expected, Flags, StoredCredential};
use crate::digest::lower_hex;

/// The credential's private key.
enum SoftKey {
    P256(EcdsaKeyPair),
    Ed25519(Ed25519KeyPair),
    Rsa(RsaKeyPair),
}

/// One credential on a software authenticator.
pub struct Authenticator {
    key: SoftKey,
    alg: CoseAlgorithm,
    credential_id: Vec<u8>,
    public_key_cose: Vec<u8>,
    aaguid: [u8; 16],
}

impl fmt::Debug for Authenticator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Authenticator")
            .field("alg", &self.alg.as_str())
            .field("credential_id", &lower_hex(&self.credential_id))
            .finish_non_exhaustive()
    }
}

/// How [`Authenticator::register`] attests.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SoftAttestation {
    /// `none`, with an empty statement.
    None,
    /// `packed` self-attestation: the credential's own key signs.
    PackedSelf,
}

/// One ceremony as the browser and the authenticator see it. Start from
/// [`Ceremony::create`] or [`Ceremony::get`], which are right in every
/// field, and change the one a test is about.
#[derive(Clone, Debug)]
pub struct Ceremony {
    /// `clientDataJSON`'s `type`.
    pub client_type: String,
    /// The raw challenge (encoded base64url into `clientDataJSON`).
    pub challenge: Vec<u8>,
    /// `clientDataJSON`'s `origin`.
    pub origin: String,
    /// The rp id whose SHA-256 leads the authenticator data.
    pub rp_id: String,
    /// The flags byte, written as is (the authenticator data holds the
    /// attested credential data exactly when AT is set, and the extensions
    /// whenever [`extensions`](Ceremony::extensions) is set).
    pub flags: u8,
    /// The sign count.
    pub sign_count: u32,
    /// `clientDataJSON`'s `crossOrigin`, if written.
    pub cross_origin: Option<bool>,
    /// Members appended to `clientDataJSON` as written, each after a comma
    /// (e.g. `"topOrigin":"https://a.example"`).
    pub extra_client_data: Vec<String>,
    /// CBOR appended to the authenticator data as the extensions.
    pub extensions: Option<Vec<u8>>,
    /// How a registration is attested.
    pub attestation: SoftAttestation,
    /// The user handle an assertion returns.
    pub user_handle: Option<Vec<u8>>,
}

impl Ceremony {
    /// A right registration for `expected`: `webauthn.create`, UP, UV and
    /// AT, sign count 0, `crossOrigin: false`, attestation `none`.
    pub fn create(expected: &Expected<'_>) -> Ceremony {
        Ceremony {
            client_type: "webauthn.create".to_owned(),
            challenge: expected.challenge.to_vec(),
            origin: expected.origin.to_owned(),
            rp_id: expected.rp_id.to_owned(),
            flags: Flags::UP | Flags::UV | Flags::AT,
            sign_count: 0,
            cross_origin: Some(false),
            extra_client_data: Vec::new(),
            extensions: None,
            attestation: SoftAttestation::None,
            user_handle: None,
        }
    }

    /// A right assertion for `expected`: `webauthn.get`, UP and UV, sign
    /// count 0, `crossOrigin: false`.
    pub fn get(expected: &Expected<'_>) -> Ceremony {
        Ceremony {
            client_type: "webauthn.get".to_owned(),
            flags: Flags::UP | Flags::UV,
            ..Ceremony::create(expected)
        }
    }

    /// With this sign count.
    pub fn sign_count(mut self, count: u32) -> Ceremony {
        self.sign_count = count;
        self
    }

    /// With this flags byte.
    pub fn flags(mut self, flags: u8) -> Ceremony {
        self.flags = flags;
        self
    }

    /// With this challenge.
    pub fn challenge(mut self, challenge: &[u8]) -> Ceremony {
        self.challenge = challenge.to_vec();
        self
    }

    /// With this origin.
    pub fn origin(mut self, origin: &str) -> Ceremony {
        self.origin = origin.to_owned();
        self
    }

    /// With this rp id.
    pub fn rp_id(mut self, rp_id: &str) -> Ceremony {
        self.rp_id = rp_id.to_owned();
        self
    }

    /// With this `clientDataJSON` type.
    pub fn client_type(mut self, client_type: &str) -> Ceremony {
        self.client_type = client_type.to_owned();
        self
    }

    /// With this attestation.
    pub fn attestation(mut self, attestation: SoftAttestation) -> Ceremony {
        self.attestation = attestation;
        self
    }

    /// The `clientDataJSON` a browser would write, members in the order
    /// Chromium writes them.
    pub fn client_data_json(&self) -> Vec<u8> {
        let string = |s: &str| serde_json::to_string(s).expect("a string serialises");
        let mut json = format!(
            "{{\"type\":{},\"challenge\":\"{}\",\"origin\":{}",
            string(&self.client_type),
            URL_SAFE_NO_PAD.encode(&self.challenge),
            string(&self.origin),
        );
        if let Some(cross) = self.cross_origin {
            json.push_str(&format!(",\"crossOrigin\":{cross}"));
        }
        for member in &self.extra_client_data {
            json.push(',');
            json.push_str(member);
        }
        json.push('}');
        json.into_bytes()
    }
}

/// What `navigator.credentials.create` returns.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Registration {
    /// The CBOR attestation object.
    pub attestation_object: Vec<u8>,
    /// The client data.
    pub client_data_json: Vec<u8>,
    /// The authenticator data inside the attestation object.
    pub authenticator_data: Vec<u8>,
}

/// What `navigator.credentials.get` returns, owned.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SignedAssertion {
    pub credential_id: Vec<u8>,
    pub authenticator_data: Vec<u8>,
    pub client_data_json: Vec<u8>,
    pub signature: Vec<u8>,
    pub user_handle: Option<Vec<u8>>,
}

impl SignedAssertion {
    /// Borrowed, as [`verify_assertion`](super::verify_assertion) takes it.
    pub fn as_assertion(&self) -> Assertion<'_> {
        Assertion {
            credential_id: &self.credential_id,
            authenticator_data: &self.authenticator_data,
            client_data_json: &self.client_data_json,
            signature: &self.signature,
            user_handle: self.user_handle.as_deref(),
        }
    }

    /// As a decision carries it: each field base64url without padding.
    pub fn to_passkey_assertion(&self) -> crate::PasskeyAssertion {
        let b64 = |b: &[u8]| URL_SAFE_NO_PAD.encode(b);
        crate::PasskeyAssertion {
            credential_id: b64(&self.credential_id),
            authenticator_data: b64(&self.authenticator_data),
            client_data_json: b64(&self.client_data_json),
            signature: b64(&self.signature),
            user_handle: self.user_handle.as_deref().map(b64),
        }
    }
}

impl Authenticator {
    /// A new credential of `alg`, with a random 32-byte credential id and
    /// AAGUID.
    ///
    /// # Panics
    ///
    /// If aws-lc cannot generate a key (a test fails there, which is right).
    pub fn new(alg: CoseAlgorithm) -> Authenticator {
        let rng = SystemRandom::new();
        let (key, public_key_cose) = match alg {
            CoseAlgorithm::Es256 => {
                let key = EcdsaKeyPair::generate(&ECDSA_P256_SHA256_ASN1_SIGNING)
                    .expect("aws-lc makes a P-256 key");
                let point = key.public_key().as_ref();
                let cose = cose_ec2(&point[1..33], &point[33..65]);
                (SoftKey::P256(key), cose)
            }
            CoseAlgorithm::EdDsa => {
                let key = Ed25519KeyPair::generate().expect("aws-lc makes an Ed25519 key");
                let cose = cose_okp(key.public_key().as_ref());
                (SoftKey::Ed25519(key), cose)
            }
            CoseAlgorithm::Rs256 => {
                let key = RsaKeyPair::generate(KeySize::Rsa2048).expect("aws-lc makes an RSA key");
                let public = key.public_key();
                let cose = cose_rsa(
                    public.modulus().big_endian_without_leading_zero(),
                    public.exponent().big_endian_without_leading_zero(),
                );
                (SoftKey::Rsa(key), cose)
            }
        };
        let mut credential_id = vec![0u8; 32];
        let mut aaguid = [0u8; 16];
        rng.fill(&mut credential_id).expect("random bytes");
        rng.fill(&mut aaguid).expect("random bytes");
        Authenticator {
            key,
            alg,
            credential_id,
            public_key_cose,
            aaguid,
        }
    }

    /// The same key under another credential id.
    pub fn with_credential_id(mut self, id: &[u8]) -> Authenticator {
        self.credential_id = id.to_vec();
        self
    }

    /// The key's algorithm.
    pub fn alg(&self) -> CoseAlgorithm {
        self.alg
    }

    /// The credential id.
    pub fn credential_id(&self) -> &[u8] {
        &self.credential_id
    }

    /// The COSE public key, as registration reports it.
    pub fn public_key_cose(&self) -> &[u8] {
        &self.public_key_cose
    }

    /// The AAGUID registration reports.
    pub fn aaguid(&self) -> [u8; 16] {
        self.aaguid
    }

    /// The credential as a verifier stores it, with `sign_count` the
    /// highest seen.
    pub fn stored(&self, sign_count: u32) -> StoredCredential<'_> {
        StoredCredential {
            id: &self.credential_id,
            public_key_cose: &self.public_key_cose,
            sign_count,
        }
    }

    /// This key's signature of `message` in WebAuthn's encoding (ES256: ASN.1
    /// DER; EdDSA: 64 raw bytes; RS256: PKCS#1 v1.5).
    pub fn sign(&self, message: &[u8]) -> Vec<u8> {
        let rng = SystemRandom::new();
        match &self.key {
            SoftKey::P256(key) => key
                .sign(&rng, message)
                .expect("aws-lc signs")
                .as_ref()
                .to_vec(),
            SoftKey::Ed25519(key) => key.sign(message).as_ref().to_vec(),
            SoftKey::Rsa(key) => {
                let mut signature = vec![0u8; key.public_modulus_len()];
                key.sign(&RSA_PKCS1_SHA256, &rng, message, &mut signature)
                    .expect("aws-lc signs");
                signature
            }
        }
    }

    /// The authenticator data of `ceremony`: the rp id hash, the flags, the
    /// sign count, this credential if AT is set, the extensions if any.
    pub fn authenticator_data(&self, ceremony: &Ceremony) -> Vec<u8> {
        let mut data = digest(&SHA256, ceremony.rp_id.as_bytes()).as_ref().to_vec();
        data.push(ceremony.flags);
        data.extend_from_slice(&ceremony.sign_count.to_be_bytes());
        if ceremony.flags & Flags::AT != 0 {
            data.extend_from_slice(&self.aaguid);
            let len =
                u16::try_from(self.credential_id.len()).expect("a credential id fits 16 bits");
            data.extend_from_slice(&len.to_be_bytes());
            data.extend_from_slice(&self.credential_id);
            data.extend_from_slice(&self.public_key_cose);
        }
        if let Some(extensions) = &ceremony.extensions {
            data.extend_from_slice(extensions);
        }
        data
    }

    /// Answer a `create` ceremony.
    pub fn register(&self, ceremony: &Ceremony) -> Registration {
        let client_data_json = ceremony.client_data_json();
        let authenticator_data = self.authenticator_data(ceremony);
        let mut object = Vec::new();
        head(&mut object, 5, 3);
        text(&mut object, "fmt");
        match ceremony.attestation {
            SoftAttestation::None => {
                text(&mut object, "none");
                text(&mut object, "attStmt");
                head(&mut object, 5, 0);
            }
            SoftAttestation::PackedSelf => {
                text(&mut object, "packed");
                text(&mut object, "attStmt");
                head(&mut object, 5, 2);
                text(&mut object, "alg");
                int(&mut object, self.alg.id());
                text(&mut object, "sig");
                let signature = self.sign(&message(&authenticator_data, &client_data_json));
                bytes(&mut object, &signature);
            }
        }
        text(&mut object, "authData");
        bytes(&mut object, &authenticator_data);
        Registration {
            attestation_object: object,
            client_data_json,
            authenticator_data,
        }
    }

    /// Answer a `get` ceremony.
    pub fn assert(&self, ceremony: &Ceremony) -> SignedAssertion {
        let client_data_json = ceremony.client_data_json();
        let authenticator_data = self.authenticator_data(ceremony);
        let signature = self.sign(&message(&authenticator_data, &client_data_json));
        SignedAssertion {
            credential_id: self.credential_id.clone(),
            authenticator_data,
            client_data_json,
            signature,
            user_handle: ceremony.user_handle.clone(),
        }
    }
}

/// `authenticatorData || SHA-256(clientDataJSON)`.
fn message(authenticator_data: &[u8], client_data_json: &[u8]) -> Vec<u8> {
    let mut message = authenticator_data.to_vec();
    message.extend_from_slice(digest(&SHA256, client_data_json).as_ref());
    message
}

/// A CBOR head with the shortest argument.
fn head(out: &mut Vec<u8>, major: u8, arg: u64) {
    let major = major << 5;
    match arg {
        0..=23 => out.push(major | arg as u8),
        24..=0xff => out.extend_from_slice(&[major | 24, arg as u8]),
        0x100..=0xffff => {
            out.push(major | 25);
            out.extend_from_slice(&(arg as u16).to_be_bytes());
        }
        0x1_0000..=0xffff_ffff => {
            out.push(major | 26);
            out.extend_from_slice(&(arg as u32).to_be_bytes());
        }
        _ => {
            out.push(major | 27);
            out.extend_from_slice(&arg.to_be_bytes());
        }
    }
}

fn int(out: &mut Vec<u8>, value: i64) {
    if value >= 0 {
        head(out, 0, value as u64);
    } else {
        head(out, 1, (-1 - value) as u64);
    }
}

fn bytes(out: &mut Vec<u8>, value: &[u8]) {
    head(out, 2, value.len() as u64);
    out.extend_from_slice(value);
}

fn text(out: &mut Vec<u8>, value: &str) {
    head(out, 3, value.len() as u64);
    out.extend_from_slice(value.as_bytes());
}

/// An ES256 COSE key, labels in CTAP2's canonical order.
fn cose_ec2(x: &[u8], y: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    head(&mut out, 5, 5);
    for (label, value) in [(1, 2), (3, CoseAlgorithm::Es256.id()), (-1, 1)] {
        int(&mut out, label);
        int(&mut out, value);
    }
    int(&mut out, -2);
    bytes(&mut out, x);
    int(&mut out, -3);
    bytes(&mut out, y);
    out
}

/// An EdDSA (Ed25519) COSE key.
fn cose_okp(x: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    head(&mut out, 5, 4);
    for (label, value) in [(1, 1), (3, CoseAlgorithm::EdDsa.id()), (-1, 6)] {
        int(&mut out, label);
        int(&mut out, value);
    }
    int(&mut out, -2);
    bytes(&mut out, x);
    out
}

/// An RS256 COSE key.
fn cose_rsa(n: &[u8], e: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    head(&mut out, 5, 4);
    for (label, value) in [(1, 3), (3, CoseAlgorithm::Rs256.id())] {
        int(&mut out, label);
        int(&mut out, value);
    }
    int(&mut out, -1);
    bytes(&mut out, n);
    int(&mut out, -2);
    bytes(&mut out, e);
    out
}
