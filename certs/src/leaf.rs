//! A leaf certificate for one name, with its own key, ready for rustls.

use std::fmt;
use std::sync::Arc;

use rcgen::{
    CertificateParams, DistinguishedName, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyUsagePurpose,
    SanType,
};
use rustls::pki_types::CertificateDer;
use rustls::sign::CertifiedKey;
use time::OffsetDateTime;

use crate::digest::certificate_pem;
use crate::error::CertError;
use crate::key::{EcKey, LeafKey};

/// A certificate for one host name, signed by the session's intermediate
/// for that name's nesting level, and its fresh P-256 key.
///
/// rustls takes it as [`certified_key`](Leaf::certified_key): the chain is
/// `[leaf, intermediate]` (the session trusts the root, so the root is not
/// sent) and the key is this crate's own `rustls::sign::SigningKey`, so
/// rustls never sees an encoded private key.
///
/// The certificate: SAN dNSName = the name (subject empty, SAN critical),
/// EKU serverAuth, key usage digitalSignature, not a CA, an authority key
/// identifier naming the intermediate, and the CA's own validity period.
pub struct Leaf {
    name: String,
    // invariant: `certified.cert` is `[leaf, intermediate]`, and `certified.key` is a
    // `LeafKey` whose public key is the leaf certificate's.
    certified: Arc<CertifiedKey>,
}

impl Leaf {
    /// The name the leaf is for.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The chain and key for a rustls server (`ResolvesServerCert`).
    pub fn certified_key(&self) -> &Arc<CertifiedKey> {
        &self.certified
    }

    /// The chain and key for a rustls server, taking the leaf apart.
    pub fn into_certified_key(self) -> Arc<CertifiedKey> {
        self.certified
    }

    /// The leaf certificate's DER.
    pub fn cert_der(&self) -> &CertificateDer<'static> {
        &self.certified.cert[0]
    }

    /// The leaf certificate as PEM.
    pub fn cert_pem(&self) -> String {
        certificate_pem(self.cert_der())
    }
}

impl fmt::Debug for Leaf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Not rustls's CertifiedKey Debug, which prints the certificates'
        // bytes: a name is all a log line needs.
        f.debug_struct("Leaf").field("name", &self.name).finish()
    }
}

/// Makes a key and signs a leaf for `san` with `issuer` (whose certificate
/// is `issuer_der`), valid from `not_before` to `not_after`. The caller has
/// decided that the issuer may sign for `san`.
pub(crate) fn sign(
    issuer: &Issuer<'_, EcKey>,
    issuer_der: &CertificateDer<'static>,
    name: &str,
    san: SanType,
    not_before: OffsetDateTime,
    not_after: OffsetDateTime,
) -> Result<Leaf, CertError> {
    let key = LeafKey::new(EcKey::generate()?);

    let mut params = CertificateParams::default();
    // An empty subject and a critical SAN (which rcgen marks so when the
    // subject is empty): host names can be 253 characters, a common name
    // only 64, and every verifier reads the SAN.
    params.distinguished_name = DistinguishedName::new();
    params.subject_alt_names = vec![san];
    params.is_ca = IsCa::ExplicitNoCa;
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    // OpenSSL's strict mode (Python 3.13's default) wants an AKI on every
    // certificate that is not self-signed.
    params.use_authority_key_identifier_extension = true;
    params.not_before = not_before;
    params.not_after = not_after;
    // The serial is rcgen's default: 20 bytes of SHA-256 over the fresh
    // public key, so unique per leaf.

    let cert = params
        .signed_by(key.public(), issuer)
        .map_err(|source| CertError::Build {
            subject: name.to_owned(),
            source,
        })?;

    let chain = vec![CertificateDer::from(cert), issuer_der.clone()];
    Ok(Leaf {
        name: name.to_owned(),
        certified: Arc::new(CertifiedKey::new(chain, Arc::new(key))),
    })
}
