//! Digests and text forms of public certificates.
//!
//! Only public data passes through here: certificate DER or signed
//! payloads in, hex or PEM text out.

use aws_lc_rs::digest::{digest, SHA384};

/// Length of [`sha384_hex`]'s output: 48 bytes, two hex digits each.
pub(crate) const SHA384_HEX_LEN: usize = 96;

/// SHA-384 of `bytes` as 96 lowercase hex digits.
///
/// This is how the gateway and the control plane name a session CA: the
/// digest of its certificate's DER.
pub fn sha384_hex(bytes: &[u8]) -> String {
    lower_hex(digest(&SHA384, bytes).as_ref())
}

/// `bytes` as lowercase hex, two digits each.
pub(crate) fn lower_hex(bytes: &[u8]) -> String {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(bytes.len() * 2);
    for byte in bytes {
        out.push(char::from(HEX[usize::from(byte >> 4)]));
        out.push(char::from(HEX[usize::from(byte & 0x0f)]));
    }
    out
}

/// Whether `text` has the form of a [`sha384_hex`] output: 96 lowercase
/// hex digits.
pub(crate) fn is_sha384_hex(text: &str) -> bool {
    text.len() == SHA384_HEX_LEN
        && text
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// A certificate's DER as PEM (`-----BEGIN CERTIFICATE-----`, base64 in
/// 64-character lines, LF line endings).
///
/// Written here rather than taken from rcgen so that leaves, which keep only
/// their DER, need not also keep rcgen's certificate object.
pub(crate) fn certificate_pem(der: &[u8]) -> String {
    const BASE64: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    // RFC 7468: lines of exactly 64 characters but the last.
    const LINE: usize = 64;

    let mut text = Vec::with_capacity(der.len().div_ceil(3) * 4);
    for chunk in der.chunks(3) {
        let byte = |i: usize| u32::from(chunk.get(i).copied().unwrap_or(0));
        let group = (byte(0) << 16) | (byte(1) << 8) | byte(2);
        for i in 0..4 {
            if i <= chunk.len() {
                let sextet = (group >> (18 - 6 * i)) & 0x3f;
                text.push(BASE64[sextet as usize]);
            } else {
                text.push(b'=');
            }
        }
    }

    let mut pem = String::with_capacity(text.len() + text.len() / LINE + 64);
    pem.push_str("-----BEGIN CERTIFICATE-----\n");
    for line in text.chunks(LINE) {
        // Every byte comes from the base64 table or is '=': ASCII.
        pem.extend(line.iter().map(|&b| char::from(b)));
        pem.push('\n');
    }
    pem.push_str("-----END CERTIFICATE-----\n");
    pem
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sha384_of_empty_input() {
        // FIPS 180-2 / NIST test vector for the empty message.
        assert_eq!(
            sha384_hex(b""),
            "38b060a751ac96384cd9327eb1b1e36a21fdb71114be07434c0cc7bf63f6e1da\
             274edebfe76f65fbd51ad2f14898b95b"
        );
        assert_eq!(sha384_hex(b"abc").len(), SHA384_HEX_LEN);
    }

    #[test]
    fn base64_padding_and_lines() {
        // RFC 4648 section 10 vectors, in one line each.
        for (input, expected) in [
            (&b"f"[..], "Zg=="),
            (b"fo", "Zm8="),
            (b"foo", "Zm9v"),
            (b"foob", "Zm9vYg=="),
            (b"fooba", "Zm9vYmE="),
            (b"foobar", "Zm9vYmFy"),
        ] {
            let pem = certificate_pem(input);
            assert_eq!(
                pem,
                format!("-----BEGIN CERTIFICATE-----\n{expected}\n-----END CERTIFICATE-----\n")
            );
        }
        // 48 bytes make exactly one full line; 49 spill into a second.
        let lines = |n: usize| certificate_pem(&vec![0xa5; n]).lines().count() - 2;
        assert_eq!(lines(48), 1);
        assert_eq!(lines(49), 2);
    }
}
