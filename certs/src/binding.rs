//! Key bindings: a signing key tied to its role and id under the control
//! CA, so that someone who trusts only that CA can tell whose signature a
//! batch, a report, a decision or a certificate carries.
//!
//! The Ed25519 keys that sign ([`GatewayKey`](crate::GatewayKey)s: each
//! member's, the relay's, the control plane's) are made where they are
//! used, after `control-stub init` made the control channel's
//! certificates, so no certificate names them. Each is bound instead by a
//! signature of the control-channel key beside it, whose certificate the
//! control CA issued with the role (talos-contract `role`) and the id as
//! DNS names:
//!
//! - a member's signing key, by the member's own control-channel key (its
//!   certificate names the gateway role and the gateway id); the member
//!   signs it at every start and gives it with its key in `Describe`;
//! - the relay's key and the control plane's key, by the control stub's
//!   control-channel key (its certificate names the control-plane role and
//!   `control-stub`).
//!
//! # The binding
//!
//! A JSON object (standard base64 with padding, as in the envelopes):
//!
//! ```text
//! {"kind":"key_binding","payload":"<base64>","certificate":"<base64 DER>","signature":"<base64 DER>"}
//! ```
//!
//! - `payload`: `{"role":"gateway","id":"gw-a","public_key":"<64 hex>"}`,
//!   keys in that order, no whitespace; `role` is `gateway`, `relay` or
//!   `plane`; `id` is the gateway id, or `control-stub` for the relay's and
//!   the plane's keys; `public_key` the raw 32-byte Ed25519 key, lowercase
//!   hex.
//! - `certificate`: the signer's control-channel certificate (DER), which
//!   must chain to the control CA and name the role's DNS name and `id`.
//! - `signature`: ECDSA P-256 with SHA-256 (DER `Ecdsa-Sig-Value`) by that
//!   certificate's key over
//!
//! ```text
//! "talos-v1" 0x00 0x06 <payload bytes>
//! ```
//!
//! the envelopes' domain with a kind byte of its own (`0x06`), so no
//! binding is ever a valid envelope signature or the reverse (the
//! algorithms differ too).
//!
//! A binding is not secret: it holds public keys, a public certificate and
//! a signature.

use serde::{Deserialize, Serialize};

use crate::digest::lower_hex;

/// The kind byte of a key binding's signed message (after the envelopes'
/// `0x01`–`0x05`).
pub const KEY_BINDING_TAG: u8 = 0x06;

/// The role of a gateway's signing key.
pub const ROLE_GATEWAY: &str = "gateway";
/// The role of the approval relay's key.
pub const ROLE_RELAY: &str = "relay";
/// The role of the control plane's certificate-signing key.
pub const ROLE_PLANE: &str = "plane";

/// The signed statement: this key has this role and id.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BindingPayload {
    /// `gateway`, `relay` or `plane`.
    pub role: String,
    /// The gateway id, or `control-stub`.
    pub id: String,
    /// The Ed25519 public key, 64 lowercase hex digits.
    pub public_key: String,
}

/// A key binding as it travels (see the module docs).
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KeyBinding {
    /// Always `key_binding`.
    pub kind: String,
    /// The payload's exact bytes.
    #[serde(with = "b64")]
    pub payload: Vec<u8>,
    /// The signer's certificate, DER.
    #[serde(with = "b64")]
    pub certificate: Vec<u8>,
    /// ECDSA P-256 SHA-256, DER.
    #[serde(with = "b64")]
    pub signature: Vec<u8>,
}

impl std::fmt::Debug for KeyBinding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeyBinding")
            .field("payload", &String::from_utf8_lossy(&self.payload))
            .field("certificate_len", &self.certificate.len())
            .field("signature_len", &self.signature.len())
            .finish()
    }
}

impl KeyBinding {
    /// Binds `public_key` to `role` and `id`, signed with the
    /// control-channel key `signer_der` (PKCS#8 or SEC1 DER, ECDSA P-256)
    /// whose certificate is `certificate_der`.
    pub fn sign(
        signer_der: &[u8],
        certificate_der: Vec<u8>,
        role: &str,
        id: &str,
        public_key: &[u8; 32],
    ) -> Result<KeyBinding, BindingError> {
        use aws_lc_rs::signature::{EcdsaKeyPair, ECDSA_P256_SHA256_ASN1_SIGNING};
        let pair = EcdsaKeyPair::from_private_key_der(&ECDSA_P256_SHA256_ASN1_SIGNING, signer_der)
            .map_err(|_| BindingError::NotP256)?;
        let payload = serde_json::to_vec(&BindingPayload {
            role: role.to_owned(),
            id: id.to_owned(),
            public_key: lower_hex(public_key),
        })
        .expect("strings always serialise");
        let rng = aws_lc_rs::rand::SystemRandom::new();
        let signature = pair
            .sign(&rng, &binding_message(&payload))
            .map_err(|_| BindingError::Signing)?;
        Ok(KeyBinding {
            kind: "key_binding".into(),
            payload,
            certificate: certificate_der,
            signature: signature.as_ref().to_vec(),
        })
    }

    /// The payload, parsed (its signature unchecked).
    pub fn claims(&self) -> Result<BindingPayload, BindingError> {
        serde_json::from_slice(&self.payload).map_err(|_| BindingError::Malformed)
    }

    /// The binding as its JSON text.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("strings always serialise")
    }
}

/// The message a binding's signature covers: the envelopes' domain, the
/// binding's kind byte, the payload.
pub fn binding_message(payload: &[u8]) -> Vec<u8> {
    let mut message = Vec::with_capacity(10 + payload.len());
    message.extend_from_slice(b"talos-v1\0");
    message.push(KEY_BINDING_TAG);
    message.extend_from_slice(payload);
    message
}

/// Why no binding was made or read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum BindingError {
    /// The control-channel key is not an ECDSA P-256 key aws-lc reads.
    #[error("the control-channel key is not an ECDSA P-256 key (PKCS#8 or SEC1 DER)")]
    NotP256,
    /// aws-lc could not sign.
    #[error("aws-lc could not sign the key binding")]
    Signing,
    /// The payload is not a binding's.
    #[error("the key binding's payload is not a binding")]
    Malformed,
}

/// Byte strings as standard base64 with padding, decoded strictly.
mod b64 {
    use base64::engine::general_purpose::STANDARD;
    use base64::Engine as _;
    use serde::{Deserialize as _, Deserializer, Serializer};

    pub(super) fn serialize<S: Serializer>(bytes: &[u8], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&STANDARD.encode(bytes))
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        let text = std::borrow::Cow::<str>::deserialize(d)?;
        STANDARD
            .decode(text.as_bytes())
            .map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A control CA and a gateway certificate issued by it, as `init` makes
    /// them: the gateway's id and role as DNS names.
    fn issued(names: &[&str]) -> (Vec<u8>, Vec<u8>, Vec<u8>) {
        use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
        let ca_key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        let ca_cert = ca.self_signed(&ca_key).unwrap();
        let issuer = Issuer::new(ca, &ca_key);
        let key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        let params =
            CertificateParams::new(names.iter().map(|n| (*n).to_owned()).collect::<Vec<_>>())
                .unwrap();
        let cert = params.signed_by(&key, &issuer).unwrap();
        (
            ca_cert.der().to_vec(),
            cert.der().to_vec(),
            key.serialize_der(),
        )
    }

    #[test]
    fn a_binding_verifies_under_the_certificate_that_names_its_role_and_id() {
        let (ca, cert, key) = issued(&["gw-a", talos_contract::role::GATEWAY]);
        let signing = crate::GatewayKey::generate().unwrap();
        let binding = KeyBinding::sign(
            &key,
            cert.clone(),
            ROLE_GATEWAY,
            "gw-a",
            &signing.public_key(),
        )
        .unwrap();
        let claims = binding.claims().unwrap();
        assert_eq!(claims.role, "gateway");
        assert_eq!(claims.id, "gw-a");
        assert_eq!(claims.public_key, lower_hex(&signing.public_key()));
        assert_eq!(
            String::from_utf8(binding.payload.clone()).unwrap(),
            format!(
                r#"{{"role":"gateway","id":"gw-a","public_key":"{}"}}"#,
                lower_hex(&signing.public_key())
            )
        );

        // What a verifier does: the certificate chains to the CA and names
        // the role and the id; the signature verifies under its key.
        let anchor = webpki::anchor_from_trusted_cert(&ca.as_slice().into())
            .unwrap()
            .to_owned();
        let der = rustls::pki_types::CertificateDer::from(cert.as_slice());
        let ee = webpki::EndEntityCert::try_from(&der).unwrap();
        let algs = rustls::crypto::aws_lc_rs::default_provider()
            .signature_verification_algorithms
            .all;
        ee.verify_for_usage(
            algs,
            &[anchor],
            &[],
            rustls::pki_types::UnixTime::now(),
            webpki::KeyUsage::client_auth(),
            None,
            None,
        )
        .unwrap();
        for name in ["gw-a", talos_contract::role::GATEWAY] {
            let name = rustls::pki_types::ServerName::try_from(name).unwrap();
            ee.verify_is_valid_for_subject_name(&name).unwrap();
        }
        let message = binding_message(&binding.payload);
        ee.verify_signature(
            webpki::aws_lc_rs::ECDSA_P256_SHA256,
            &message,
            &binding.signature,
        )
        .unwrap();

        // One flipped payload byte, or another kind byte, and it does not.
        let mut flipped = message.clone();
        *flipped.last_mut().unwrap() ^= 1;
        assert!(ee
            .verify_signature(
                webpki::aws_lc_rs::ECDSA_P256_SHA256,
                &flipped,
                &binding.signature
            )
            .is_err());
        let mut as_batch = message;
        as_batch[9] = 0x01;
        assert!(ee
            .verify_signature(
                webpki::aws_lc_rs::ECDSA_P256_SHA256,
                &as_batch,
                &binding.signature
            )
            .is_err());

        // The JSON form round-trips.
        let back: KeyBinding = serde_json::from_str(&binding.to_json()).unwrap();
        assert_eq!(back, binding);
    }

    #[test]
    fn only_a_p256_key_signs_a_binding() {
        let ed = aws_lc_rs::signature::Ed25519KeyPair::generate()
            .unwrap()
            .to_pkcs8()
            .unwrap();
        assert_eq!(
            KeyBinding::sign(ed.as_ref(), Vec::new(), ROLE_GATEWAY, "gw-a", &[0; 32]).unwrap_err(),
            BindingError::NotP256
        );
    }
}
