//! COSE public keys (RFC 9052, RFC 9053, RFC 8230) of the three algorithms
//! accepted, and the signature check under each.
//!
//! | alg | name | `kty` | parameters | signature |
//! |---|---|---|---|---|
//! | -7 | ES256 | 2 (EC2) | `crv` 1 (P-256), `x` and `y` 32 bytes each | ECDSA over SHA-256, ASN.1 DER (WebAuthn §6.5.6) |
//! | -8 | EdDSA | 1 (OKP) | `crv` 6 (Ed25519), `x` 32 bytes | Ed25519, 64 bytes raw |
//! | -257 | RS256 | 3 (RSA) | `n` 2048–8192 bits, `e` odd, 3 to 2^32-1 | RSASSA-PKCS1-v1_5 with SHA-256 |
//!
//! A key must carry `kty` and `alg`, and the parameters of its type, once
//! each; other labels (`kid`, `key_ops`, …) are read past. An EC2 key's
//! point must be given uncompressed (WebAuthn forbids the compressed form)
//! and lie on P-256, which aws-lc checks when the key is parsed.

use aws_lc_rs::signature::{
    ParsedPublicKey, RsaPublicKeyComponents, ECDSA_P256_SHA256_ASN1, ED25519,
    RSA_PKCS1_2048_8192_SHA256,
};

use super::cbor::{CborError, Key, Keys, Reader};

/// The COSE algorithms a credential may use.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum CoseAlgorithm {
    /// ECDSA on P-256 with SHA-256 (COSE -7): what every passkey provider
    /// supports, and the one the web app asks for first.
    Es256,
    /// Ed25519 (COSE -8).
    EdDsa,
    /// RSASSA-PKCS1-v1_5 with SHA-256 (COSE -257): Windows Hello.
    Rs256,
}

impl CoseAlgorithm {
    /// Every algorithm accepted, in the order the web app offers them.
    pub const ALL: [CoseAlgorithm; 3] = [
        CoseAlgorithm::Es256,
        CoseAlgorithm::EdDsa,
        CoseAlgorithm::Rs256,
    ];

    /// The COSE algorithm identifier: -7, -8 or -257.
    pub const fn id(self) -> i64 {
        match self {
            CoseAlgorithm::Es256 => -7,
            CoseAlgorithm::EdDsa => -8,
            CoseAlgorithm::Rs256 => -257,
        }
    }

    /// The algorithm of a COSE identifier, if it is one of the three.
    pub const fn from_id(id: i64) -> Option<CoseAlgorithm> {
        match id {
            -7 => Some(CoseAlgorithm::Es256),
            -8 => Some(CoseAlgorithm::EdDsa),
            -257 => Some(CoseAlgorithm::Rs256),
            _ => None,
        }
    }

    /// `ES256`, `EdDSA` or `RS256` (the IANA COSE names).
    pub const fn as_str(self) -> &'static str {
        match self {
            CoseAlgorithm::Es256 => "ES256",
            CoseAlgorithm::EdDsa => "EdDSA",
            CoseAlgorithm::Rs256 => "RS256",
        }
    }
}

/// Why COSE key bytes are not a key this module accepts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum KeyError {
    /// Not a COSE key at all: bad CBOR, a missing or repeated label, a
    /// parameter of the wrong CBOR type.
    #[error("malformed COSE key: {0}")]
    Malformed(&'static str),
    /// A well-formed key of an algorithm not accepted (ES384, Ed448, PS256,
    /// …).
    #[error("COSE algorithm {0} is not one of ES256, EdDSA or RS256")]
    UnsupportedAlgorithm(i64),
    /// A key of an accepted algorithm whose parameters are unusable: a
    /// point not on the curve, a compressed point, an RSA modulus too
    /// small, a `kty` or `crv` the algorithm does not use.
    #[error("unusable {alg} key: {reason}")]
    BadKey {
        /// The key's algorithm.
        alg: &'static str,
        /// What is wrong with it.
        reason: &'static str,
    },
}

impl KeyError {
    /// A stable snake_case name: `malformed`, `unsupported_algorithm` or
    /// `bad_key`.
    pub const fn as_str(&self) -> &'static str {
        match self {
            KeyError::Malformed(_) => "malformed",
            KeyError::UnsupportedAlgorithm(_) => "unsupported_algorithm",
            KeyError::BadKey { .. } => "bad_key",
        }
    }
}

impl From<CborError> for KeyError {
    fn from(e: CborError) -> KeyError {
        KeyError::Malformed(e.describe())
    }
}

// COSE labels (RFC 9052 §7.1, RFC 9053 §7, RFC 8230 §4).
const LABEL_KTY: i64 = 1;
const LABEL_ALG: i64 = 3;
/// `crv` (EC2, OKP) or `n` (RSA).
const LABEL_MINUS_1: i64 = -1;
/// `x` (EC2, OKP) or `e` (RSA).
const LABEL_MINUS_2: i64 = -2;
/// `y` (EC2).
const LABEL_MINUS_3: i64 = -3;

const KTY_OKP: i64 = 1;
const KTY_EC2: i64 = 2;
const KTY_RSA: i64 = 3;
const CRV_P256: i64 = 1;
const CRV_ED25519: i64 = 6;

/// The smallest RSA modulus accepted, in bits (WebAuthn's RS256 and NIST
/// SP 800-131A both ask for at least 2048).
pub(crate) const MIN_RSA_BITS: usize = 2048;
/// The largest, in bits: aws-lc's PKCS#1 verifier stops there too, and a
/// bigger key would only cost the gateway more per decision.
pub(crate) const MAX_RSA_BITS: usize = 8192;

/// A parameter's value as read: labels -1 to -3 are integers or byte
/// strings depending on the key type, so they are kept as read and judged
/// once `kty` and `alg` are known.
#[derive(Clone, Copy)]
enum Param<'a> {
    Int(i64),
    Bytes(&'a [u8]),
    /// Any other CBOR type (a boolean `y`: a compressed point).
    Other,
}

/// A parsed public key, ready to check signatures.
pub(crate) struct PublicKey {
    alg: CoseAlgorithm,
    key: ParsedPublicKey,
    /// The key as an X.509 `SubjectPublicKeyInfo` (DER), what `openssl`
    /// and Python's `cryptography` read.
    spki: Vec<u8>,
}

impl std::fmt::Debug for PublicKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PublicKey")
            .field("alg", &self.alg.as_str())
            .finish_non_exhaustive()
    }
}

impl PublicKey {
    /// The key in `bytes`, which must hold exactly one COSE key.
    pub(crate) fn parse(bytes: &[u8]) -> Result<PublicKey, KeyError> {
        let mut reader = Reader::new(bytes);
        let key = PublicKey::read(&mut reader)?;
        if !reader.is_empty() {
            return Err(KeyError::Malformed("bytes after the COSE key"));
        }
        Ok(key)
    }

    /// Read one COSE key from `reader`, leaving it just past the key.
    pub(crate) fn read(reader: &mut Reader<'_>) -> Result<PublicKey, KeyError> {
        let entries = reader.map()?;
        let mut keys = Keys::default();
        let (mut kty, mut alg) = (None, None);
        let (mut p1, mut p2, mut p3) = (None, None, None);
        for _ in 0..entries {
            let key = reader.key()?;
            keys.insert(key)?;
            match key {
                Key::Int(LABEL_KTY) => kty = Some(reader.int().map_err(|_| bad_type("kty"))?),
                Key::Int(LABEL_ALG) => alg = Some(reader.int().map_err(|_| bad_type("alg"))?),
                Key::Int(label @ (LABEL_MINUS_1 | LABEL_MINUS_2 | LABEL_MINUS_3)) => {
                    let value = match reader.peek_major()? {
                        0 | 1 => Param::Int(reader.int()?),
                        2 => Param::Bytes(reader.bytes()?),
                        _ => {
                            reader.skip()?;
                            Param::Other
                        }
                    };
                    match label {
                        LABEL_MINUS_1 => p1 = Some(value),
                        LABEL_MINUS_2 => p2 = Some(value),
                        _ => p3 = Some(value),
                    }
                }
                _ => reader.skip()?,
            }
        }
        let kty = kty.ok_or(KeyError::Malformed("COSE key without kty"))?;
        let alg_id = alg.ok_or(KeyError::Malformed("COSE key without alg"))?;
        let alg = CoseAlgorithm::from_id(alg_id).ok_or(KeyError::UnsupportedAlgorithm(alg_id))?;
        let bad = |reason| KeyError::BadKey {
            alg: alg.as_str(),
            reason,
        };
        let key = match alg {
            CoseAlgorithm::Es256 => {
                if kty != KTY_EC2 {
                    return Err(bad("kty is not EC2"));
                }
                if !matches!(p1, Some(Param::Int(CRV_P256))) {
                    return Err(bad("crv is not P-256"));
                }
                let x = fixed(p2, 32).ok_or(bad("x is not 32 bytes"))?;
                let y = match p3 {
                    Some(Param::Other) => return Err(bad("the point is compressed")),
                    _ => fixed(p3, 32).ok_or(bad("y is not 32 bytes"))?,
                };
                let mut point = [0u8; 65];
                point[0] = 0x04;
                point[1..33].copy_from_slice(x);
                point[33..].copy_from_slice(y);
                let parsed = ParsedPublicKey::new(&ECDSA_P256_SHA256_ASN1, point)
                    .map_err(|_| bad("the point is not on P-256"))?;
                (parsed, der::spki(der::EC_P256_ALGORITHM, &point))
            }
            CoseAlgorithm::EdDsa => {
                if kty != KTY_OKP {
                    return Err(bad("kty is not OKP"));
                }
                if !matches!(p1, Some(Param::Int(CRV_ED25519))) {
                    return Err(bad("crv is not Ed25519"));
                }
                let x = fixed(p2, 32).ok_or(bad("x is not 32 bytes"))?;
                let parsed = ParsedPublicKey::new(&ED25519, x)
                    .map_err(|_| bad("x is not an Ed25519 key"))?;
                (parsed, der::spki(der::ED25519_ALGORITHM, x))
            }
            CoseAlgorithm::Rs256 => {
                if kty != KTY_RSA {
                    return Err(bad("kty is not RSA"));
                }
                let (Some(Param::Bytes(n)), Some(Param::Bytes(e))) = (p1, p2) else {
                    return Err(bad("n and e are not byte strings"));
                };
                let n = strip_leading_zeros(n);
                let e = strip_leading_zeros(e);
                let bits = match n.first() {
                    Some(&first) => n.len() * 8 - first.leading_zeros() as usize,
                    None => 0,
                };
                if bits < MIN_RSA_BITS {
                    return Err(bad("the modulus is shorter than 2048 bits"));
                }
                if bits > MAX_RSA_BITS {
                    return Err(bad("the modulus is longer than 8192 bits"));
                }
                if n[n.len() - 1] & 1 == 0 {
                    return Err(bad("the modulus is even"));
                }
                let exponent_ok = !e.is_empty()
                    && e.len() <= 4
                    && e[e.len() - 1] & 1 == 1
                    && !(e.len() == 1 && e[0] < 3);
                if !exponent_ok {
                    return Err(bad("the exponent is not odd and between 3 and 2^32"));
                }
                let parsed = RsaPublicKeyComponents { n, e }
                    .to_parsed_public_key(&RSA_PKCS1_2048_8192_SHA256)
                    .map_err(|_| bad("aws-lc refuses the modulus and exponent"))?;
                (
                    parsed,
                    der::spki(der::RSA_ALGORITHM, &der::rsa_public_key(n, e)),
                )
            }
        };
        let (key, spki) = key;
        Ok(PublicKey { alg, key, spki })
    }

    /// The key as an X.509 `SubjectPublicKeyInfo`, DER.
    pub(crate) fn spki_der(&self) -> &[u8] {
        &self.spki
    }

    /// The key's algorithm.
    pub(crate) fn alg(&self) -> CoseAlgorithm {
        self.alg
    }

    /// Whether `signature` is this key's signature of `message`, in the
    /// encoding WebAuthn gives each algorithm (see the module's table).
    pub(crate) fn verify(&self, message: &[u8], signature: &[u8]) -> bool {
        self.key.verify_sig(message, signature).is_ok()
    }
}

fn bad_type(label: &'static str) -> KeyError {
    KeyError::Malformed(match label {
        "kty" => "COSE kty is not an integer",
        _ => "COSE alg is not an integer",
    })
}

fn fixed<'a>(param: Option<Param<'a>>, len: usize) -> Option<&'a [u8]> {
    match param {
        Some(Param::Bytes(b)) if b.len() == len => Some(b),
        _ => None,
    }
}

fn strip_leading_zeros(bytes: &[u8]) -> &[u8] {
    let first = bytes.iter().position(|&b| b != 0).unwrap_or(bytes.len());
    &bytes[first..]
}

/// The few DER encodings a `SubjectPublicKeyInfo` of the three key types
/// needs (X.690; RFC 5480 for P-256, RFC 8410 for Ed25519, RFC 8017
/// appendix A.1.1 for RSA): nothing is parsed here, only written.
mod der {
    /// `AlgorithmIdentifier` of an EC key on P-256: id-ecPublicKey
    /// (1.2.840.10045.2.1) with the named curve prime256v1
    /// (1.2.840.10045.3.1.7).
    pub(super) const EC_P256_ALGORITHM: &[u8] = &[
        0x30, 0x13, 0x06, 0x07, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x02, 0x01, 0x06, 0x08, 0x2a, 0x86,
        0x48, 0xce, 0x3d, 0x03, 0x01, 0x07,
    ];
    /// `AlgorithmIdentifier` of Ed25519: id-Ed25519 (1.3.101.112), no
    /// parameters.
    pub(super) const ED25519_ALGORITHM: &[u8] = &[0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70];
    /// `AlgorithmIdentifier` of rsaEncryption (1.2.840.113549.1.1.1) with
    /// NULL parameters.
    pub(super) const RSA_ALGORITHM: &[u8] = &[
        0x30, 0x0d, 0x06, 0x09, 0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, 0x01, 0x05, 0x00,
    ];

    /// A tag and its definite length, then `content`.
    fn tlv(tag: u8, content: &[u8]) -> Vec<u8> {
        let mut out = vec![tag];
        let n = content.len();
        if n < 0x80 {
            out.push(n as u8);
        } else {
            let bytes = n.to_be_bytes();
            let first = bytes
                .iter()
                .position(|&b| b != 0)
                .unwrap_or(bytes.len() - 1);
            out.push(0x80 | (bytes.len() - first) as u8);
            out.extend_from_slice(&bytes[first..]);
        }
        out.extend_from_slice(content);
        out
    }

    /// A non-negative INTEGER of the big-endian `magnitude` (no leading
    /// zeros): a zero byte first when its top bit is set.
    fn unsigned(magnitude: &[u8]) -> Vec<u8> {
        let mut content = Vec::with_capacity(magnitude.len() + 1);
        if magnitude.first().is_none_or(|&b| b & 0x80 != 0) {
            content.push(0);
        }
        content.extend_from_slice(magnitude);
        tlv(0x02, &content)
    }

    /// `RSAPublicKey ::= SEQUENCE { modulus INTEGER, publicExponent INTEGER }`.
    pub(super) fn rsa_public_key(n: &[u8], e: &[u8]) -> Vec<u8> {
        let mut content = unsigned(n);
        content.extend_from_slice(&unsigned(e));
        tlv(0x30, &content)
    }

    /// `SubjectPublicKeyInfo ::= SEQUENCE { algorithm, subjectPublicKey BIT STRING }`.
    pub(super) fn spki(algorithm: &[u8], key: &[u8]) -> Vec<u8> {
        let mut bits = Vec::with_capacity(key.len() + 1);
        bits.push(0);
        bits.extend_from_slice(key);
        let mut content = algorithm.to_vec();
        content.extend_from_slice(&tlv(0x03, &bits));
        tlv(0x30, &content)
    }
}
