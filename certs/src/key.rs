//! P-256 keys that live inside aws-lc and only ever sign.
//!
//! [`EcKey`] wraps an aws-lc `EcdsaKeyPair` made by `generate`, so the
//! private scalar is created inside aws-lc's memory and never asked for in
//! any encoded form. rcgen signs certificates through [`EcKey`]'s
//! `rcgen::SigningKey` implementation; rustls signs handshakes through
//! [`LeafKey`]'s `rustls::sign::SigningKey` implementation. aws-lc cleanses
//! the key's memory when it frees it (see the crate docs).

use std::fmt;
use std::sync::Arc;

use aws_lc_rs::rand::SystemRandom;
use aws_lc_rs::signature::{EcdsaKeyPair, KeyPair as _, ECDSA_P256_SHA256_ASN1_SIGNING};
use rustls::pki_types::SubjectPublicKeyInfoDer;
use rustls::sign::{Signer, SigningKey as RustlsSigningKey};
use rustls::{SignatureAlgorithm, SignatureScheme};

use zeroize::Zeroizing;

use crate::error::CertError;

/// An ECDSA P-256 private key held by aws-lc.
///
/// Deliberately not `Clone`: there is one owner (a CA, or a leaf's
/// [`LeafKey`] through an `Arc`), and dropping it frees the key.
pub(crate) struct EcKey {
    // invariant: made by `EcdsaKeyPair::generate` (or handed over by the
    // process that generated it); encoded only by `export_pkcs8`, for a
    // handover to a successor process.
    pair: EcdsaKeyPair,
}

impl EcKey {
    /// A fresh key from aws-lc's generator.
    pub(crate) fn generate() -> Result<Self, CertError> {
        let pair = EcdsaKeyPair::generate(&ECDSA_P256_SHA256_ASN1_SIGNING)
            .map_err(|_| CertError::KeyGeneration)?;
        Ok(EcKey { pair })
    }

    /// The key as PKCS#8 (v1) DER, for a handover to a successor process
    /// only (`SessionCa::export_for_handover`), in a buffer wiped on drop.
    pub(crate) fn export_pkcs8(&self) -> Result<Zeroizing<Vec<u8>>, CertError> {
        // aws-lc's document is copied once into the wiping buffer; the
        // document itself wipes its bytes when dropped at the end of this
        // function.
        let doc = self
            .pair
            .to_pkcs8v1()
            .map_err(|_| CertError::KeyGeneration)?;
        Ok(Zeroizing::new(doc.as_ref().to_vec()))
    }

    /// A key handed over by a predecessor process (PKCS#8 DER).
    pub(crate) fn import_pkcs8(der: &[u8]) -> Result<Self, CertError> {
        let pair =
            EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_ASN1_SIGNING, der).map_err(|_| {
                CertError::Handover {
                    reason: "a key is not a P-256 PKCS#8 key",
                }
            })?;
        Ok(EcKey { pair })
    }

    /// The uncompressed public point (65 bytes).
    pub(crate) fn public_point(&self) -> &[u8] {
        self.pair.public_key().as_ref()
    }

    /// An ASN.1 (DER) ECDSA signature over SHA-256 of `message`: the form
    /// both X.509 and TLS 1.3's `ecdsa_secp256r1_sha256` carry.
    fn sign_p256_sha256(&self, message: &[u8]) -> Option<Vec<u8>> {
        // aws-lc draws its own nonce; the generator argument is there for
        // ring compatibility and unused.
        let signature = self.pair.sign(&SystemRandom::new(), message).ok()?;
        Some(signature.as_ref().to_vec())
    }
}

impl fmt::Debug for EcKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Nothing of the key, not even the public half: a Debug line should
        // never be mistaken for key material.
        f.write_str("EcKey(P-256, held by aws-lc)")
    }
}

impl rcgen::PublicKeyData for EcKey {
    /// The uncompressed public point (65 bytes), which rcgen places in the
    /// certificate's SubjectPublicKeyInfo.
    fn der_bytes(&self) -> &[u8] {
        self.pair.public_key().as_ref()
    }

    fn algorithm(&self) -> &'static rcgen::SignatureAlgorithm {
        &rcgen::PKCS_ECDSA_P256_SHA256
    }
}

impl rcgen::SigningKey for EcKey {
    fn sign(&self, msg: &[u8]) -> Result<Vec<u8>, rcgen::Error> {
        self.sign_p256_sha256(msg)
            .ok_or(rcgen::Error::RingUnspecified)
    }
}

/// A leaf's key as rustls sees it: it can choose a scheme and sign, and
/// nothing else.
pub(crate) struct LeafKey {
    // invariant: the only other holders of this Arc are the `P256Signer`s
    // handed to rustls for one handshake each.
    key: Arc<EcKey>,
    /// SubjectPublicKeyInfo DER, so rustls can check that key and
    /// certificate match (`CertifiedKey::keys_match`).
    spki: Vec<u8>,
}

impl LeafKey {
    pub(crate) fn new(key: EcKey) -> Self {
        let spki = rcgen::PublicKeyData::subject_public_key_info(&key);
        LeafKey {
            key: Arc::new(key),
            spki,
        }
    }

    /// The key for rcgen to place in the leaf certificate.
    pub(crate) fn public(&self) -> &EcKey {
        &self.key
    }
}

impl fmt::Debug for LeafKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("LeafKey(P-256, held by aws-lc)")
    }
}

impl RustlsSigningKey for LeafKey {
    fn choose_scheme(&self, offered: &[SignatureScheme]) -> Option<Box<dyn Signer>> {
        offered
            .contains(&SignatureScheme::ECDSA_NISTP256_SHA256)
            .then(|| Box::new(P256Signer(Arc::clone(&self.key))) as Box<dyn Signer>)
    }

    fn public_key(&self) -> Option<SubjectPublicKeyInfoDer<'_>> {
        Some(SubjectPublicKeyInfoDer::from(self.spki.as_slice()))
    }

    fn algorithm(&self) -> SignatureAlgorithm {
        SignatureAlgorithm::ECDSA
    }
}

/// Signs one handshake with `ecdsa_secp256r1_sha256`.
struct P256Signer(Arc<EcKey>);

impl fmt::Debug for P256Signer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("P256Signer(ecdsa_secp256r1_sha256)")
    }
}

impl Signer for P256Signer {
    fn sign(&self, message: &[u8]) -> Result<Vec<u8>, rustls::Error> {
        self.0
            .sign_p256_sha256(message)
            .ok_or_else(|| rustls::Error::General("aws-lc could not sign with a leaf key".into()))
    }

    fn scheme(&self) -> SignatureScheme {
        SignatureScheme::ECDSA_NISTP256_SHA256
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offers_p256_only_when_the_peer_does() {
        let key = LeafKey::new(EcKey::generate().unwrap());
        assert!(key
            .choose_scheme(&[
                SignatureScheme::RSA_PSS_SHA256,
                SignatureScheme::ECDSA_NISTP384_SHA384,
                SignatureScheme::ED25519,
            ])
            .is_none());
        let signer = key
            .choose_scheme(&[
                SignatureScheme::ED25519,
                SignatureScheme::ECDSA_NISTP256_SHA256,
            ])
            .unwrap();
        assert_eq!(signer.scheme(), SignatureScheme::ECDSA_NISTP256_SHA256);
        assert_eq!(key.algorithm(), SignatureAlgorithm::ECDSA);

        // The signature verifies under the public key aws-lc reports.
        let signature = signer.sign(b"hello").unwrap();
        let public = rcgen::PublicKeyData::der_bytes(key.public()).to_vec();
        aws_lc_rs::signature::UnparsedPublicKey::new(
            &aws_lc_rs::signature::ECDSA_P256_SHA256_ASN1,
            public,
        )
        .verify(b"hello", &signature)
        .unwrap();
    }

    #[test]
    fn debug_shows_no_key() {
        let key = LeafKey::new(EcKey::generate().unwrap());
        assert_eq!(format!("{key:?}"), "LeafKey(P-256, held by aws-lc)");
        assert_eq!(
            format!("{:?}", key.public()),
            "EcKey(P-256, held by aws-lc)"
        );
    }
}
